"""Temporal features from the event time: hour of day, weekday, and the item's age then."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from core.features.ops.base import Columns, FeatureOp

_SECONDS_PER_YEAR = 365.2425 * 86_400


class Temporal(FeatureOp):
    """``hour`` (0-23, UTC), ``weekday`` (0 = Monday) and, when the items have a year
    (``year`` not None), ``item_age_years`` (recency of content).

    At serving time the event time is the request time, so the same code gives the same
    features for the same rows.
    """

    kind: ClassVar[str] = "temporal"

    def __init__(self, timestamp: str = "timestamp", year: str | None = "year") -> None:
        self.timestamp = timestamp
        self.year = year

    @property
    def inputs(self) -> list[str]:
        return [self.timestamp] if self.year is None else [self.timestamp, self.year]

    @property
    def outputs(self) -> list[str]:
        return ["hour", "weekday"] if self.year is None else ["hour", "weekday", "item_age_years"]

    def partial_fit(self, columns: Columns) -> None:
        """Nothing to learn: the features are functions of the row."""
        self._require(columns)

    def merge(self, parts: Sequence[None]) -> None:
        return None

    def combine(self, parts: Sequence[None]) -> None:
        return None

    def transform(self, columns: Columns) -> Columns:
        self._require(columns)
        seconds = np.asarray(columns[self.timestamp], dtype=np.int64)
        days = seconds // 86_400
        out = {
            "hour": ((seconds // 3_600) % 24).astype(np.int64),
            "weekday": ((days + 3) % 7).astype(np.int64),  # 1970-01-01 was a Thursday
        }
        if self.year is not None:
            event_year = 1970.0 + seconds / _SECONDS_PER_YEAR
            release = np.asarray(columns[self.year], dtype=np.float64)
            age = np.where(np.isnan(release), 0.0, np.clip(event_year - release, 0.0, None))
            out["item_age_years"] = age.astype(np.float32)
        return out

    def config(self) -> dict[str, Any]:
        return {"timestamp": self.timestamp, "year": self.year}
