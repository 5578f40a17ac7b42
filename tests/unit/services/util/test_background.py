"""BackgroundTask.stop() ends a loop even when a cancellation is swallowed once."""

from __future__ import annotations

import asyncio

from services.util.background import BackgroundTask


async def test_stop_cancels_again_when_a_cancellation_is_swallowed() -> None:
    swallowed = []

    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:  # what 3.11's wait_for can do to a cancellation
                if not swallowed:
                    swallowed.append(True)
                    continue
                raise

    background = BackgroundTask()
    background.start(stubborn())
    await asyncio.sleep(0)
    await asyncio.wait_for(background.stop(), 5)
    assert swallowed == [True]


async def test_stop_without_start_and_twice_is_harmless() -> None:
    background = BackgroundTask()
    await background.stop()
    background.start(asyncio.sleep(0))
    await background.stop()
    await background.stop()
