"""A coroutine that runs beside the request path (a monitor, a writer, a follower), started
and stopped by its owner's ``start()`` / ``close()``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class BackgroundTask:
    """Holds one task; ``stop()`` cancels it and waits until it is gone."""

    def __init__(self) -> None:
        self._task: asyncio.Task[Any] | None = None

    def start(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        self._task = asyncio.get_running_loop().create_task(coroutine)

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Cancel until the task is done. Python 3.11's ``asyncio.wait_for`` can swallow a
        cancellation that arrives as the awaited call finishes (fixed in 3.12), and a loop
        around it then runs on: one ``cancel()`` and an ``await`` would wait forever."""
        task, self._task = self._task, None
        if task is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=0.1)
            if not task.done() and loop.time() > deadline:
                log.error("background task %r did not stop within %.0f s", task, timeout_s)
                return
        with contextlib.suppress(asyncio.CancelledError, Exception):
            task.result()
