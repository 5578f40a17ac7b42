"""Request and response bodies.

Requests are strict: unknown fields, a string where a number belongs (``"k": "5"``) and a
boolean where an id or a number belongs are rejected with 422 naming the field. User and item
ids are the data set's own (``services.serving.ids.Id``): a JSON integer that fits the int64
the stages compute with (``INT64_MAX``) or a string of 1..256 characters; answers give them
back as the same JSON types.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from core.ids import ExternalId
from services.serving.ids import INT64_MAX, Id


def _number_not_text(value: object) -> object:
    """JSON numbers only: ``"1"`` and ``true`` are not numbers (``3.0`` is 3, as in JSON Schema)."""
    if isinstance(value, str | bool):
        raise ValueError("must be a JSON number, not a string or a boolean")
    return value


# integers given as JSON numbers; the bounds stand before the validator so that the OpenAPI
# document states them as minimum/maximum
_NUMBER = BeforeValidator(_number_not_text)
Seconds = Annotated[int, Field(ge=0, le=INT64_MAX), _NUMBER]
Version = Annotated[int, Field(ge=1, le=INT64_MAX), _NUMBER]
Count = Annotated[int, Field(ge=1, le=500), _NUMBER]
Text = Annotated[str, Field(max_length=256)]
Scalar = Text | int | float | bool


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RecommendRequest(_Strict):
    user_id: Id = Field(
        description="The user to recommend for: the data set's id, a JSON integer or a string "
        "of 1..256 characters. A user the served release does not know (a string on a "
        "release of integer ids included) gets a cold-start answer.",
    )
    k: Count = Field(20, description="How many items to return.")
    context: dict[Annotated[str, Field(max_length=64)], Scalar] = Field(
        default_factory=dict, max_length=32, description="Flat key/value request context."
    )
    exclude: list[Id] = Field(
        default_factory=list,
        max_length=1000,
        description="Item ids never to return; ids the served release does not know are ignored.",
    )
    model_version: Version | None = Field(None, description="Pin a served model version.")


class ScoredItem(BaseModel):
    item_id: ExternalId = Field(
        description="The data set's id: an integer for a release of integer ids, else a string."
    )
    score: float


class RecommendResponse(BaseModel):
    request_id: str
    user_id: ExternalId = Field(description="The request's user_id, as sent.")
    items: list[ScoredItem]
    model_versions: dict[str, int]
    degraded: bool
    reasons: list[str]
    timings_ms: dict[str, float]


class FeedbackEvent(_Strict):
    user_id: Id = Field(
        description="The data set's id (as in /v1/recommend). An id the serving release does "
        "not know is stored untrusted (unknown_id).",
    )
    item_id: Id = Field(description="The data set's id, as in the answer's items.")
    type: Literal["impression", "click"]
    model_version: Version | None = Field(
        None,
        description="Ignored (accepted so that older clients are not refused): an event is "
        "attributed only through its request_id, to the version the server logged.",
    )
    timestamp: Seconds | None = Field(None, description="Unix seconds; default: receive time.")
    request_id: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{32}$",
        description="The request_id of the answer this event is about: the event counts "
        "as evidence about the model version that served it only when the server logged that "
        "answer for the same user and (for the item) showed it; without one the event is "
        "organic.",
    )
    event_id: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.:-]{1,64}$",
        description="Idempotency key: an event whose id was stored before (within the "
        "idempotency TTL) is acknowledged again but not stored twice, so retries are safe.",
    )


class FeedbackRequest(_Strict):
    events: list[FeedbackEvent] = Field(min_length=1, max_length=1000)


class FeedbackResponse(BaseModel):
    stored: int = Field(description="Events newly stored by this call.")
    duplicates: int = Field(0, description="Events whose event_id was already stored.")
    ids: list[str] = Field(description="Stream id of every event, in request order.")


class ErrorResponse(BaseModel):
    """Every non-422 error body."""

    detail: str


ERROR_RESPONSES: dict[int | str, dict] = {
    400: {"model": ErrorResponse, "description": "The body could not be read."},
    413: {"model": ErrorResponse, "description": "The body is larger than the configured limit."},
    503: {"model": ErrorResponse, "description": "No answer is possible right now."},
}


# -- the Alertmanager webhook (POST /v1/admin/alerts) -----------------------------------------
# Alertmanager's webhook payload, version 4. Fields Alertmanager may add in later versions are
# ignored (not refused), so an upgrade of Alertmanager never turns retraining alerts into 422s.

LabelSet = dict[Annotated[str, Field(max_length=256)], Annotated[str, Field(max_length=4096)]]


def _time_text(value: object) -> object:
    """Times are RFC 3339 strings, as Alertmanager sends them (not numbers)."""
    if not isinstance(value, str):
        raise ValueError("must be an RFC 3339 time string")
    return value


Time = Annotated[datetime, BeforeValidator(_time_text)]


class _Webhook(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class Alert(_Webhook):
    status: Literal["firing", "resolved"]
    labels: LabelSet = Field(max_length=256)
    annotations: LabelSet = Field(default_factory=dict, max_length=256)
    starts_at: Time = Field(alias="startsAt")
    ends_at: Time | None = Field(None, alias="endsAt")
    generator_url: str = Field("", alias="generatorURL", max_length=4096)
    fingerprint: str = Field("", max_length=64)


class AlertmanagerPayload(_Webhook):
    version: Literal["4"]
    group_key: str = Field(alias="groupKey", min_length=1, max_length=4096)
    truncated_alerts: Annotated[int, Field(ge=0), _NUMBER] = Field(0, alias="truncatedAlerts")
    status: Literal["firing", "resolved"]
    receiver: str = Field(max_length=256)
    group_labels: LabelSet = Field(default_factory=dict, alias="groupLabels", max_length=256)
    common_labels: LabelSet = Field(default_factory=dict, alias="commonLabels", max_length=256)
    external_url: str = Field("", alias="externalURL", max_length=4096)
    alerts: list[Alert] = Field(min_length=1, max_length=1000)


class AlertDecision(BaseModel):
    """What the webhook did with one notification."""

    decision: Literal["enqueued", "duplicate", "cooldown", "resolved", "not_retrain"]
    request_id: str | None = Field(
        None, description="The retrain request enqueued now (or earlier, for a duplicate)."
    )
