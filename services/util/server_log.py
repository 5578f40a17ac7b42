"""How a serving process logs: a timed line per state change and one when it is ready."""

from __future__ import annotations

import logging

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_server_logging() -> None:
    """INFO lines to stderr (once per process: a second call changes nothing)."""
    logging.basicConfig(level=logging.INFO, format=FORMAT)
    logging.getLogger("faiss").setLevel(logging.WARNING)  # its loader's INFO lines are noise
