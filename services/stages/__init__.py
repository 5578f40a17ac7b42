"""The serving stages, one per module, all with the ``Stage`` call shape."""
