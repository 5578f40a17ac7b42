"""The request context every stage reads and writes, and the stage contract."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from core.ids import ExternalId
from services.metrics import FALLBACKS
from services.stores.base import UserRecord

EMPTY_IDS = np.zeros(0, dtype=np.int64)
EMPTY_SCORES = np.zeros(0, dtype=np.float32)


@dataclass
class RequestContext:
    """One request's state. Candidate arrays are catalog positions (rows of the release's item
    table), kept as numpy arrays end to end. Ids are the release's internal ids; the request's
    and the answer's ids as the data set names them are ``external_user_id`` and
    ``external_item_ids`` (set by the gateway)."""

    user_id: int
    k: int
    timestamp: int
    model_version: int
    split: str = ""  # the canary split that assigned model_version ("": requested or none)
    context: dict[str, Any] = field(default_factory=dict)
    exclude: np.ndarray = field(default_factory=lambda: EMPTY_IDS)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    user: UserRecord | None = None
    unavailable: np.ndarray = field(default_factory=lambda: EMPTY_IDS)
    banned: np.ndarray = field(default_factory=lambda: EMPTY_IDS)  # positions never to return
    candidates: np.ndarray = field(default_factory=lambda: EMPTY_IDS)
    retrieval_scores: np.ndarray = field(default_factory=lambda: EMPTY_SCORES)
    scores: np.ndarray = field(default_factory=lambda: EMPTY_SCORES)
    encoded_user: dict[str, Any] | None = None  # the user's features, encoded once
    reasons: list[str] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)
    external_user_id: ExternalId = 0
    external_item_ids: list[ExternalId] = field(default_factory=list)  # the answer's items

    @property
    def degraded(self) -> bool:
        return bool(self.reasons)

    def degrade(self, stage: str, reason: str) -> None:
        """Record a fallback: shown in the response and counted in Prometheus."""
        self.reasons.append(f"{stage}:{reason}")
        FALLBACKS.labels(stage=stage, reason=reason).inc()

    @staticmethod
    def count_fallback(stage: str, reason: str) -> None:
        """Count a fallback that is the normal answer, not a degradation (a new user's
        popularity candidates)."""
        FALLBACKS.labels(stage=stage, reason=reason).inc()


class Stage(Protocol):
    """A serving stage: reads and updates the context; degrades instead of raising."""

    name: str

    async def __call__(self, ctx: RequestContext) -> RequestContext: ...
