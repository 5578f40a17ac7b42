"""A coroutine that runs beside the request path (a monitor, a writer, a follower), started
and stopped by its owner's ``start()`` / ``close()``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any


class BackgroundTask:
    """Holds one task; ``stop()`` cancels it and waits until it is gone."""

    def __init__(self) -> None:
        self._task: asyncio.Task[Any] | None = None

    def start(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        self._task = asyncio.get_running_loop().create_task(coroutine)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
