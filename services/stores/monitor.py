"""Watches the online store so that a Redis that came back empty is noticed and repaired.

Every few seconds (and at once when a request sees the store empty) the monitor reads the
completeness marker ``materialize`` writes last and whether the store persists feedback.
An empty store is reloaded from the served release when the settings allow, by one gateway
replica at a time (a lock in the store), so recovery needs no operator and no restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from services.metrics import ONLINE_STORE_STATE, STORE_STATES
from services.stores.base import Durability, OnlineStore
from services.stores.materialize import materialize
from services.util.background import BackgroundTask

log = logging.getLogger(__name__)

LOCK = "materialize"


class StoreMonitor:
    """State of the online store: ``ok``, ``empty``, ``loading``, ``unreachable`` or
    ``unknown`` (not checked yet), and its feedback durability."""

    def __init__(
        self,
        store: OnlineStore,
        release_dir: Path,
        auto_materialize: bool,
        period_s: float = 2.0,
        timeout_s: float = 2.0,
        lock_ttl_s: float = 600.0,
    ) -> None:
        self.store = store
        self.release_dir = release_dir
        self.auto_materialize = auto_materialize
        self.period_s = period_s
        self.timeout_s = timeout_s
        self.lock_ttl_s = lock_ttl_s
        self.state = "unknown"
        self.durability: Durability | None = None
        self._wake = asyncio.Event()
        self._background = BackgroundTask()

    def _set(self, state: str) -> None:
        if state != self.state:
            level = logging.INFO if state == "ok" else logging.WARNING
            log.log(level, "online store: %s -> %s", self.state, state)
        self.state = state
        for known in STORE_STATES:
            ONLINE_STORE_STATE.labels(state=known).set(1.0 if known == state else 0.0)

    def notice_empty(self) -> None:
        """A request found the store without its marker: check (and repair) now."""
        self._wake.set()

    async def check(self) -> str:
        """One check; reloads the store when it is empty and that is allowed."""
        try:
            marker, durability = await asyncio.wait_for(
                asyncio.gather(self.store.loaded_marker(), self.store.durability()),
                self.timeout_s,
            )
        except Exception as error:  # unreachable, timing out, refusing: nothing to repair yet
            log.debug("online store check failed: %r", error)
            self._set("unreachable")
            return self.state
        self.durability = durability
        if marker is not None:
            self._set("ok")
        elif not self.auto_materialize:
            self._set("empty")
        else:
            await self._reload()
        return self.state

    async def _reload(self) -> None:
        if not await self.store.try_lock(LOCK, self.lock_ttl_s):
            self._set("loading")  # another replica is reloading it
            return
        self._set("loading")
        try:
            count = await materialize(self.store, self.release_dir)
            log.warning("online store was empty: reloaded %d users of %s", count, self.release_dir)
            self._set("ok")
        except Exception as error:
            log.error("reloading the empty online store failed: %r", error)
            self._set("empty")
        finally:
            with contextlib.suppress(Exception):
                await self.store.unlock(LOCK)

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.period_s)
            self._wake.clear()
            await self.check()

    def start(self) -> None:
        """Watch in the background (the first check has been awaited by the caller)."""
        self._background.start(self._run())

    async def close(self) -> None:
        await self._background.stop()
