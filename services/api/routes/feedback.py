"""POST /v1/feedback: impressions and clicks from a client holding a key, acknowledged only
once stored durably.

Each event is stored with the trust level the server gives it (``services.events.attribution``):
``served`` when its ``request_id`` names an answer this fleet logged, for the same user and
an item that answer showed, and then with the version the server recorded; ``organic``
without a ``request_id``; else untrusted with the reason. Only ``served`` events count
toward a version's KPIs (CTR, hit rate) and the rollout's analysis. Counters move only for
events stored now (a retried ``event_id`` moves none); their label values come from fixed
sets, never from the body.

Events name users and items by the data set's ids, as answers do; they are stored with the
internal ids of the version that served the answer (``unknown_id`` and 0 for an id its maps
do not know), so the streams the retrain reads hold the models' ids.
"""

from __future__ import annotations

import time
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials

from core.ids import UNKNOWN
from services.api.credentials import KeyRing, bearer, fingerprint
from services.api.deps import GatewayDep
from services.api.schemas import (
    ERROR_RESPONSES,
    ErrorResponse,
    FeedbackEvent,
    FeedbackRequest,
    FeedbackResponse,
)
from services.errors import FeedbackNotDurable
from services.events.attribution import SERVED, vouch
from services.metrics import FEEDBACK, FEEDBACK_DUPLICATES, HITS, version_label
from services.serving.gateway import Gateway
from services.stores.base import Answer

OPEN_SOURCE = "open"  # the source of events accepted without a key (feedback.open)

router = APIRouter()


def feedback_source(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> str:
    """Which client sends the events: the fingerprint of the key it proved it holds
    (``open`` when the gateway accepts feedback without one). 401 otherwise."""
    settings = request.app.state.gateway.settings.feedback
    keys: KeyRing = request.app.state.feedback_keys
    if credentials is not None and keys.configured:
        key = keys.match(credentials.credentials)
        if key is not None:
            return fingerprint(key)
    if settings.open:
        return OPEN_SOURCE
    if not keys.configured:
        raise HTTPException(
            401,
            "feedback needs a client key and this gateway has none configured "
            "(set CASCADE_FEEDBACK__KEYS or CASCADE_FEEDBACK__KEYS_FILE)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    raise HTTPException(
        401,
        "a valid feedback key is required (Authorization: Bearer <key>)",
        headers={"WWW-Authenticate": "Bearer"},
    )


async def _answers(gateway: Gateway, body: FeedbackRequest) -> dict[str, Answer | None]:
    """The logged answer of each ``request_id`` the events name: from the store, or from
    this gateway's impression sets not yet written there."""
    request_ids = sorted({e.request_id for e in body.events if e.request_id})
    if not request_ids:
        return {}
    timeout_s = gateway.settings.redis.feedback_timeout_ms / 1000
    found = await gateway.redis_breaker.call(lambda: gateway.store.answers(request_ids), timeout_s)
    answers = dict(zip(request_ids, found, strict=True))
    if gateway.impressions is not None:  # answered just now: its set may still be queued
        for request_id, answer in answers.items():
            if answer is None:
                answers[request_id] = gateway.impressions.pending_answer(request_id)
    return answers


def _internal_ids(
    gateway: Gateway, events: list[FeedbackEvent], answers: dict[str, Answer | None]
) -> tuple[np.ndarray, np.ndarray]:
    """Each event's user and item as internal ids (``UNKNOWN``: not in the maps), by the id
    maps of the version that served the answer its ``request_id`` names, else (organic, or
    no such answer) the production version's."""
    versions = []
    for event in events:
        answer = answers.get(event.request_id or "")
        versions.append(answer.version if answer is not None else None)
    users, items = np.zeros(len(events), np.int64), np.zeros(len(events), np.int64)
    for version in set(versions):
        rows = [i for i, v in enumerate(versions) if v == version]
        ids = gateway.release_ids(version)
        users[rows] = ids.users.to_internal([events[i].user_id for i in rows])
        items[rows] = ids.items.to_internal([events[i].item_id for i in rows])
    return users, items


async def _first_clicks(gateway: Gateway, clicked: list[str]) -> set[str]:
    """Of the answers that got a served click now, those whose first click this is: their
    impression set becomes a hit (stored on the event as ``hit: 1``)."""
    if not clicked:
        return set()
    ttl_s = gateway.settings.impressions.attribution_ttl_s
    timeout_s = gateway.settings.redis.feedback_timeout_ms / 1000
    firsts = await gateway.redis_breaker.call(
        lambda: gateway.store.first_hits(clicked, ttl_s), timeout_s
    )
    return {request_id for request_id, first in zip(clicked, firsts, strict=True) if first}


@router.post(
    "/v1/feedback",
    response_model=FeedbackResponse,
    responses={
        **ERROR_RESPONSES,
        401: {"model": ErrorResponse, "description": "No or a wrong feedback key."},
    },
)
async def feedback(
    body: FeedbackRequest,
    gateway: GatewayDep,
    source: Annotated[str, Depends(feedback_source)],
) -> FeedbackResponse:
    refusal = gateway.feedback_refusal
    if refusal is not None:
        raise FeedbackNotDurable(refusal)
    answers = await _answers(gateway, body)
    users, items = _internal_ids(gateway, body.events, answers)
    vouched = [
        vouch(
            str(user),
            str(item),
            e.request_id,
            answers.get(e.request_id or ""),
            known=user != UNKNOWN and item != UNKNOWN,
        )
        for e, user, item in zip(body.events, users.tolist(), items.tolist(), strict=True)
    ]
    served_clicks = sorted(
        {
            e.request_id
            for e, (trust, _) in zip(body.events, vouched, strict=True)
            if e.type == "click" and trust == SERVED and e.request_id
        }
    )
    hits = await _first_clicks(gateway, served_clicks)
    now = int(time.time())
    events = []
    for e, user, item, (trust, version) in zip(
        body.events, users.tolist(), items.tolist(), vouched, strict=True
    ):
        event = {
            "user_id": str(user),
            "item_id": str(item),
            "type": e.type,
            "model_version": "" if version is None else str(version),
            "timestamp": str(e.timestamp or now),
            "trust": trust,
            "source": source,
            **({"event_id": e.event_id} if e.event_id else {}),
            **({"request_id": e.request_id} if e.request_id else {}),
        }
        if e.type == "click" and trust == SERVED and e.request_id in hits:
            event["hit"] = "1"
            hits.discard(e.request_id)  # one event per request carries it
        events.append(event)
    settings = gateway.settings
    timeout_s = settings.redis.feedback_timeout_ms / 1000
    appended = await gateway.redis_breaker.call(
        lambda: gateway.store.append_feedback(
            events, settings.feedback.max_len, settings.feedback.idempotency_ttl_s
        ),
        timeout_s,
    )
    for stored, (trust, version), new in zip(events, vouched, appended.new, strict=True):
        if not new:  # a retry of an event stored before: counted then
            continue
        label = version_label(version, gateway.releases)
        FEEDBACK.labels(model_version=label, type=stored["type"], trust=trust).inc()
        if stored.get("hit"):
            HITS.labels(model_version=label).inc()
    FEEDBACK_DUPLICATES.inc(appended.duplicates)
    return FeedbackResponse(
        stored=len(appended.ids) - appended.duplicates,
        duplicates=appended.duplicates,
        ids=appended.ids,
    )
