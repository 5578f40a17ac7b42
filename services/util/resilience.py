"""Timeouts and circuit breakers around calls to Redis and Triton."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import ClassVar, TypeVar

from services.errors import DependencyUnavailable
from services.metrics import BREAKERS_OPEN
from services.settings import BreakerSettings

T = TypeVar("T")


class CircuitBreaker:
    """Closed -> (``failures`` in a row) -> open -> (after ``reset_s``) -> one trial call.

    While open, calls fail at once (no waiting on a dead dependency). Half-open admits one
    trial call at a time; concurrent callers keep failing fast meanwhile. A successful trial
    closes it again, a failed trial re-opens it.

    ``cascade_circuit_breakers_open{breaker=name}`` counts this process's breakers of a name
    that are not closed (several exist where each model version has its own cache).
    """

    _open: ClassVar[defaultdict[str, weakref.WeakSet[CircuitBreaker]]] = defaultdict(
        weakref.WeakSet
    )

    def __init__(
        self, name: str, settings: BreakerSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.name = name
        self.settings = settings
        self.clock = clock
        self.consecutive_failures = 0
        self.opened_at: float | None = None
        self.probing = False  # a half-open trial call is in flight
        self._export()  # the series exists (0) before anything fails

    def _export(self) -> None:
        opened = self._open[self.name]
        if self.opened_at is None:
            opened.discard(self)
        else:
            opened.add(self)
        BREAKERS_OPEN.labels(breaker=self.name).set(len(opened))

    @property
    def state(self) -> str:
        if self.opened_at is None:
            return "closed"
        return "half_open" if self.clock() - self.opened_at >= self.settings.reset_s else "open"

    def allow(self) -> bool:
        """Closed: yes. Open: no. Half-open: yes for one caller (the probe), no for the
        others until the probe has succeeded (closed) or failed (open again)."""
        state = self.state
        if state == "closed":
            return True
        if state == "open" or self.probing:
            return False
        self.probing = True
        return True

    def record_success(self) -> None:
        self.consecutive_failures = 0
        was_open, self.opened_at = self.opened_at is not None, None
        self.probing = False
        if was_open:
            self._export()

    def record_failure(self) -> None:
        self.consecutive_failures += 1
        if self.state == "half_open" or self.consecutive_failures >= self.settings.failures:
            was_closed, self.opened_at = self.opened_at is None, self.clock()
            if was_closed:
                self._export()
        self.probing = False

    async def call(self, make_call: Callable[[], Awaitable[T]], timeout_s: float) -> T:
        """Run ``make_call()`` within ``timeout_s``; raise DependencyUnavailable on any failure."""
        if not self.allow():
            raise DependencyUnavailable(self.name, "circuit_open")
        try:
            async with asyncio.timeout(timeout_s):  # no task per call, unlike wait_for
                result = await make_call()
        except TimeoutError:
            self.record_failure()
            raise DependencyUnavailable(self.name, "timeout") from None
        except DependencyUnavailable:
            self.record_failure()
            raise
        except Exception as error:  # any client error means the dependency did not answer
            self.record_failure()
            raise DependencyUnavailable(self.name, "error") from error
        except BaseException:  # cancelled: no verdict on the dependency, free the probe slot
            self.probing = False
            raise
        self.record_success()
        return result
