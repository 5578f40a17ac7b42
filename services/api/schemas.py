"""Request and response bodies (unknown fields are rejected with 422 naming the field)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Scalar = str | int | float | bool


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RecommendRequest(_Strict):
    user_id: int = Field(
        ge=0, description="The user to recommend for; unknown users get a cold start."
    )
    k: int = Field(20, ge=1, le=500, description="How many items to return.")
    context: dict[str, Scalar] = Field(default_factory=dict, max_length=32)
    exclude: list[int] = Field(
        default_factory=list, max_length=1000, description="Item ids never to return."
    )
    model_version: int | None = Field(None, ge=1, description="Pin a served model version.")


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
    user_id: int = Field(ge=0)
    item_id: int = Field(ge=0)
    type: Literal["impression", "click"]
    model_version: int | None = Field(None, ge=1)
    timestamp: int | None = Field(None, ge=0, description="Unix seconds; default: receive time.")


class FeedbackRequest(_Strict):
    events: list[FeedbackEvent] = Field(min_length=1, max_length=1000)


class FeedbackResponse(BaseModel):
    stored: int
    ids: list[str]
