"""A named registry lock held by a heartbeat thread, and who holds it."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from control.registry.records import (
    HOLDER,
    LockHeld,
    LockLost,
)

if TYPE_CHECKING:
    from control.registry.base import Registry

    pass

log = logging.getLogger(__name__)


class Lock:
    """A held lock, kept alive by a heartbeat thread that refreshes it every ``ttl_s / 3``
    while the holder works (a long training phase needs no refresh calls); a holder that
    dies frees it within ``ttl_s``. When a refresh finds that another holder took the lock
    (it expired, e.g. the holder was frozen longer than ``ttl_s``), the lock is *lost*:
    ``check()`` raises ``LockLost`` and the holder must stop acting. A refresh that cannot
    reach the store (an outage) is retried: nobody else can take the lock there meanwhile."""

    def __init__(self, registry: Registry, name: str, token: str, ttl_s: float, until: float):
        self.registry, self.name, self.token, self.ttl_s = registry, name, token, ttl_s
        self.holder, self.until = HOLDER, until
        self.lost: LockLost | None = None
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._refreshing = threading.Lock()

    def check(self) -> None:
        """Raise ``LockLost`` when the heartbeat found the lock taken by another holder
        (no I/O: call it before every action that needs the lock)."""
        if self.lost is not None:
            raise self.lost

    def refresh(self) -> None:
        """Extend the lock by its ttl now. Raises ``LockLost`` (a ``LockHeld``) when another
        holder has taken it, ``RegistryError`` when the store cannot be reached."""
        self.check()
        with self._refreshing:
            try:
                self.until = self.registry._refresh_lock(self.name, self.token, self.ttl_s)
            except LockLost:
                raise
            except LockHeld as error:
                self.lost = LockLost(f"{error}: this holder lost it and stops")
                raise self.lost from None

    def start_heartbeat(self) -> None:
        self._thread = threading.Thread(
            target=self._beat, name=f"lock-{self.name}-heartbeat", daemon=True
        )
        self._thread.start()

    def stop_heartbeat(self) -> None:
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(5.0, self.ttl_s))
        self._thread = None

    def _beat(self) -> None:
        failing = False
        while not self._stopped.wait(self.ttl_s / 3):
            try:
                self.refresh()
            except LockLost as error:
                log.error("%s", error)
                return
            except Exception as error:  # unreachable store: retried at the next beat
                if not failing:  # the holder logs the outage itself
                    log.info("lock %r: cannot refresh (%s); retrying", self.name, error)
                failing = True
            else:
                if failing:
                    log.info("lock %r refreshed again", self.name)
                failing = False


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """While a lock is held by the main thread of a process that keeps SIGTERM's default
    (die at once), make SIGTERM raise ``SystemExit``: the ``finally`` blocks run and the
    lock is released instead of blocking the next holder for its ttl."""
    install = (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    )
    if install:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        yield
    finally:
        if install:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def held_message(name: str, holder: dict[str, Any]) -> str:
    until = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(float(holder.get("until", 0))))
    return f"lock {name!r} is held by {holder.get('holder', '?')} until {until}"


# Compare-and-set of a lock key: extend it when it is ours or free; else return the holder.


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
