"""Request and response bodies.

Requests are strict: unknown fields, a string where a number belongs (``"user_id": "1"``) and
a boolean where an id belongs are rejected with 422 naming the field, and every id fits the
int64 the stages compute with.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

INT64_MAX = 2**63 - 1

Scalar = str | int | float | bool
ItemId = Annotated[int, Field(ge=0, le=INT64_MAX)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class RecommendRequest(_Strict):
    user_id: int = Field(
        ge=0, le=INT64_MAX, description="The user to recommend for; unknown users get a cold start."
    )
    k: int = Field(20, ge=1, le=500, description="How many items to return.")
    context: dict[str, Scalar] = Field(default_factory=dict, max_length=32)
    exclude: list[ItemId] = Field(
        default_factory=list, max_length=1000, description="Item ids never to return."
    )
    model_version: int | None = Field(
        None, ge=1, le=INT64_MAX, description="Pin a served model version."
    )


class ScoredItem(BaseModel):
    item_id: int
    score: float


class RecommendResponse(BaseModel):
    request_id: str
    user_id: int
    items: list[ScoredItem]
    model_versions: dict[str, int]
    degraded: bool
    reasons: list[str]
    timings_ms: dict[str, float]


class FeedbackEvent(_Strict):
    user_id: int = Field(ge=0, le=INT64_MAX)
    item_id: ItemId
    type: Literal["impression", "click"]
    model_version: int | None = Field(None, ge=1, le=INT64_MAX)
    timestamp: int | None = Field(
        None, ge=0, le=INT64_MAX, description="Unix seconds; default: receive time."
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
