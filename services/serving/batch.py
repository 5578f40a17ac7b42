"""Answers for a list of users at once (e-mail and push campaigns), through the gateway's own
request path: the same release, stages, rules and version routing as ``/v1/recommend``, so a
user's batch answer is the answer the gateway would give at the same moment. Answers are not
logged as impressions: nothing was shown yet.

Users are answered ``concurrency`` at a time and handed back in input order, a chunk at a
time, so memory stays bounded by the chunk, not by the number of users.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice

from core.ids import ExternalId
from services.serving.gateway import Gateway
from services.settings import Settings

# No one waits on a batch answer: a slow store or model call is waited for (these bounds are
# for a dependency that hangs) rather than answered degraded, as the request path must.
BATCH_STORE_TIMEOUT_MS = 5_000.0
BATCH_INFERENCE_TIMEOUT_MS = 60_000.0


@dataclass(frozen=True)
class BatchAnswer:
    """One user's answer: items best first, their scores, the version that answered."""

    user_id: ExternalId
    items: list[ExternalId]
    scores: list[float]
    model_version: int
    degraded: bool


def batch_settings(settings: Settings) -> Settings:
    """``settings`` with the request path's tight per-call timeouts relaxed for a batch."""
    return settings.model_copy(
        update={
            "redis": settings.redis.model_copy(update={"timeout_ms": BATCH_STORE_TIMEOUT_MS}),
            "triton": settings.triton.model_copy(update={"timeout_ms": BATCH_INFERENCE_TIMEOUT_MS}),
        }
    )


def _chunks(users: Iterable[ExternalId], size: int) -> Iterator[list[ExternalId]]:
    iterator = iter(users)
    while chunk := list(islice(iterator, size)):
        yield chunk


async def answer_all(
    gateway: Gateway,
    users: Iterable[ExternalId],
    k: int,
    at: int | None = None,
    concurrency: int = 4,
    chunk: int = 1_000,
) -> AsyncIterator[list[BatchAnswer]]:
    """Each user's top ``k`` as of unix time ``at`` (default: now), a chunk at a time, in
    input order."""
    limit = asyncio.Semaphore(concurrency)

    async def one(user: ExternalId) -> BatchAnswer:
        async with limit:
            ctx, _ = await gateway.recommend(user, k, {}, [], None, at=at)
        return BatchAnswer(
            user,
            list(ctx.external_item_ids),
            [float(s) for s in ctx.scores[: len(ctx.external_item_ids)]],
            ctx.model_version,
            ctx.degraded,
        )

    for part in _chunks(users, chunk):
        yield list(await asyncio.gather(*(one(user) for user in part)))
