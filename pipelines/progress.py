"""Progress lines for long offline steps, written for logs rather than terminals: plain
lines, at most one per interval, so a step of hours prints a line a few times a minute and
a step of seconds prints none but its last."""

from __future__ import annotations

import time
from collections.abc import Callable

PROGRESS_S = 10.0  # seconds between progress lines


class Every:
    """``due()`` is True at most once per ``seconds`` (``PROGRESS_S`` when not given), and
    never in the first ``seconds``."""

    def __init__(
        self, seconds: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.seconds = PROGRESS_S if seconds is None else seconds
        self.clock = clock
        self.started = self.last = clock()

    def due(self) -> bool:
        now = self.clock()
        if now - self.last < self.seconds:
            return False
        self.last = now
        return True

    def elapsed(self) -> float:
        return self.clock() - self.started
