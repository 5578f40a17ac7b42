"""The impression log: every answer the gateway gives, appended to a bounded stream.

Each ``/v1/recommend`` answer is one impression set ``{request_id, user_id, model_version,
split, items, scores, degraded, reasons, latency_ms, timestamp}``; the store also remembers
each ``request_id``'s answer (version, user, items shown) so that feedback is vouched for
server side (``services.events.attribution``).
Logging never fails or slows a request beyond a ``put_nowait``: answers wait in a bounded
queue that a background task writes in batches; what cannot be logged (queue full, store
failing) is counted in ``cascade_impressions_dropped_total{reason}``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Container

import numpy as np

from services.metrics import IMPRESSION_SETS, IMPRESSIONS, IMPRESSIONS_DROPPED, version_label
from services.settings import ImpressionSettings
from services.stores.base import Answer, OnlineStore
from services.util.background import BackgroundTask

log = logging.getLogger(__name__)


def impression_record(
    request_id: str,
    user_id: int,
    model_version: int,
    item_ids: np.ndarray,
    scores: np.ndarray,
    reasons: list[str] | tuple[str, ...] = (),
    latency_ms: float = 0.0,
    split: str = "",
) -> dict[str, str]:
    """One impression set as stream fields: ids and scores space-separated in rank order,
    the degraded reasons (fixed ``stage:reason`` values) and the server-side latency, so a
    rollout can judge each version's errors, degradation and latency from the log alone;
    ``split``: the canary split that assigned the version (``VersionRouter.split``; ``""``
    when the client requested it), what the rollout's sample-ratio test counts by."""
    return {
        "request_id": request_id,
        "user_id": str(user_id),
        "model_version": str(model_version),
        "split": split,
        "items": " ".join(map(str, np.asarray(item_ids).tolist())),
        "scores": " ".join(f"{s:.6g}" for s in np.asarray(scores).tolist()),
        "degraded": "1" if reasons else "0",
        "reasons": " ".join(reasons),
        "latency_ms": f"{latency_ms:.3f}",
        "timestamp": str(int(time.time())),
    }


class ImpressionLog:
    """Bounded queue + background writer in front of ``store.append_impressions``."""

    def __init__(
        self, store: OnlineStore, settings: ImpressionSettings, timeout_s: float = 1.0
    ) -> None:
        self.store = store
        self.settings = settings
        self.timeout_s = timeout_s
        self._queue: asyncio.Queue[dict[str, str]] = asyncio.Queue(settings.queue)
        self._background = BackgroundTask()
        # request_id -> answer of the sets queued or being written: a click that arrives
        # before its impression set reached the store is still vouched for
        self._pending: dict[str, Answer] = {}

    def record(self, record: dict[str, str], served: Container[int]) -> None:
        """Queue one impression set; never blocks, never raises."""
        if not self.settings.enabled:
            return
        version = version_label(int(record["model_version"]), served)
        IMPRESSION_SETS.labels(model_version=version).inc()
        IMPRESSIONS.labels(model_version=version).inc(len(record["items"].split()))
        try:
            self._queue.put_nowait(record)
        except asyncio.QueueFull:
            IMPRESSIONS_DROPPED.labels(reason="queue_full").inc()
            return
        self._pending[record["request_id"]] = Answer.of_impression(record)

    def pending_answer(self, request_id: str) -> Answer | None:
        """The answer of ``request_id`` while its set is not yet in the store."""
        return self._pending.get(request_id)

    async def _write(self, batch: list[dict[str, str]]) -> None:
        try:
            await asyncio.wait_for(
                self.store.append_impressions(
                    batch, self.settings.max_len, self.settings.attribution_ttl_s
                ),
                self.timeout_s,
            )
        except Exception as error:  # the store is away: count, never retry into a backlog
            IMPRESSIONS_DROPPED.labels(reason="store_error").inc(len(batch))
            log.debug("impression batch of %d not logged: %r", len(batch), error)
        finally:
            for record in batch:
                self._pending.pop(record["request_id"], None)

    def _take_batch(self, first: dict[str, str]) -> list[dict[str, str]]:
        batch = [first]
        while len(batch) < self.settings.batch and not self._queue.empty():
            batch.append(self._queue.get_nowait())
        return batch

    async def _run(self) -> None:
        while True:
            await self._write(self._take_batch(await self._queue.get()))

    def start(self) -> None:
        self._background.start(self._run())

    async def flush(self) -> None:
        """Write what is queued now and wait for the batch the background writer holds, so
        that every answer given before the call is in the store (or counted as dropped) when
        it returns (shutdown, tests). Waits at most the write timeout for that batch."""
        while not self._queue.empty():
            await self._write(self._take_batch(self._queue.get_nowait()))
        deadline = time.monotonic() + self.timeout_s
        while self._pending and time.monotonic() < deadline:  # the writer's batch
            await asyncio.sleep(0.005)

    async def close(self) -> None:
        await self._background.stop()
        await self.flush()
