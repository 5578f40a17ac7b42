"""The ``cascade`` command line, on top of everything: one module per command, shared
options in ``options``, the entry point in ``main``."""
