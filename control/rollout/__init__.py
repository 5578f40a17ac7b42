"""The rollout controller (``controller``), its persisted state, and the statistics that
decide it (``analysis``, ``sequential``)."""
