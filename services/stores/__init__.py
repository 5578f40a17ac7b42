"""Online stores: one interface, a Redis backend and an in-memory embedded default."""
