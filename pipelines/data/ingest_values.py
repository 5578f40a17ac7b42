"""Interaction values into Cascade's raw schema: timestamps to unix seconds and the positive
rule (event or rating) to ratings and weights."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from core.errors import DataError
from pipelines.data.dataset_file import InteractionsSpec
from pipelines.data.ingest_problems import Problems, missing_mask
from pipelines.data.reader import Batch

POSITIVE, RETRIEVAL_ONLY, NEGATIVE = 5.0, 3.0, 1.0
_SCALE = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}


def _unit(value: float) -> str:
    size = abs(value)
    return "s" if size < 1e11 else "ms" if size < 1e14 else "us" if size < 1e17 else "ns"


def _from_numbers(numbers: np.ndarray, fmt: str | None) -> tuple[np.ndarray, np.ndarray]:
    """Unix seconds of numeric timestamps: in ``fmt``'s unit, else each value's unit read
    from its magnitude (below 1e11 seconds, then ms, us, ns)."""
    bad = ~np.isfinite(numbers)
    numbers = np.where(bad, 0.0, numbers)
    if fmt is not None:
        return np.floor(numbers / _SCALE[fmt]).astype(np.int64), bad
    size = np.abs(numbers)
    scale = np.select([size < 1e11, size < 1e14, size < 1e17], [1.0, 1e3, 1e6], 1e9)
    return np.floor(numbers / scale).astype(np.int64), bad


def seconds(values: pa.Array, fmt: str | None) -> tuple[np.ndarray, np.ndarray]:
    """Unix seconds (int64) of a timestamp column, and a mask of the unparseable rows."""
    if pa.types.is_dictionary(values.type):
        values = values.cast(values.type.value_type)
    kind, numeric = values.type, fmt is None or fmt in _SCALE
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        parsed = values.cast(pa.timestamp("s"), safe=False).cast(pa.int64())
        return parsed.fill_null(0).to_numpy(), missing_mask(parsed)
    if pa.types.is_integer(kind) and numeric:
        ints = values.cast(pa.int64()).fill_null(0).to_numpy()
        bounds = pc.min_max(values).values()
        units = {_unit(v.as_py() or 0) for v in bounds}
        if fmt is not None or len(units) == 1:  # one unit for the whole batch
            return ints // _SCALE[fmt or units.pop()], missing_mask(values)
    if (pa.types.is_integer(kind) or pa.types.is_floating(kind)) and numeric:
        return _from_numbers(as_floats(values), fmt)
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        return np.zeros(len(values), np.int64), np.ones(len(values), bool)
    if fmt is not None and "%" in fmt:
        parsed = pc.strptime(values, format=fmt, unit="s", error_is_null=True).cast(pa.int64())
        return parsed.fill_null(0).to_numpy(), missing_mask(parsed)
    # ISO 8601 text, possibly beside numbers written as text (CSV)
    number = pc.match_substring_regex(values, r"^\s*-?\d+(\.\d*)?\s*$").fill_null(False)
    number = np.asarray(number, bool)
    out, bad = _from_numbers(as_floats(values), fmt if numeric else "s")
    if fmt in _SCALE:
        return out, bad
    if not number.all():
        text = values.filter(pa.array(~number))
        parsed = _parse_iso(text)
        out[~number] = parsed.fill_null(0).to_numpy()
        bad[~number] = missing_mask(parsed)
    return out, bad


def _parse_iso(values: pa.Array) -> pa.Array:
    """ISO 8601 strings as int64 unix seconds, null where unparseable."""
    for target in (pa.timestamp("ns"), pa.timestamp("ns", "UTC")):
        try:  # arrow's own parser, when every row agrees on having a zone or not
            return pc.divide(values.cast(target).cast(pa.int64()), 10**9)
        except pa.ArrowInvalid:
            pass
    parsed = pd.to_datetime(
        pd.Series(values.to_pandas(), dtype=object), format="ISO8601", utc=True, errors="coerce"
    )
    missing = parsed.isna().to_numpy()
    nanoseconds = parsed.fillna(pd.Timestamp(0, tz="UTC")).dt.as_unit("ns").astype("int64")
    return pa.array(nanoseconds.to_numpy() // 10**9, pa.int64(), mask=missing)


@dataclass
class Outcomes:
    """The positive rule applied batch by batch, with what it found."""

    spec: InteractionsSpec
    counts: dict[str, int] = field(default_factory=lambda: {"5": 0, "3": 0, "1": 0})
    values: list[Any] = field(default_factory=list)  # a few distinct values met

    def rate(self, values: pa.Array, batch: Batch, problems: Problems) -> tuple:
        """(rating, weight or None) for each row."""
        rows: np.ndarray | None = None
        if (event := self.spec.event) is not None:
            encoded = (
                values if pa.types.is_dictionary(values.type) else pc.dictionary_encode(values)
            )
            words = [str(v) for v in encoded.dictionary.to_pylist()]
            self._remember(words)
            positive = {str(v) for v in event.positive}
            neutral = {str(v) for v in event.retrieval_only}
            weights = {str(k): w for k, w in event.weight.items()}
            lut = [
                POSITIVE if w in positive else RETRIEVAL_ONLY if w in neutral else NEGATIVE
                for w in words
            ]
            codes = encoded.indices.fill_null(len(words)).to_numpy()
            classes = np.asarray([*lut, NEGATIVE], np.float32)
            rating = classes[codes]
            rows = np.bincount(codes, minlength=len(classes))  # rows per value, one pass
            weight = None
            if weights:
                weight = np.asarray([weights.get(w, 1.0) for w in words] + [1.0], np.float32)
                weight = weight[codes]
        else:
            rule = self.spec.rating
            assert rule is not None
            numbers = as_floats(values)
            bad = np.isnan(numbers)
            column = f"column {rule.column!r}"
            problems.add(f"{column}: rating is null or not a number", batch, bad)
            self._remember(np.unique(numbers[~bad])[:10].tolist())
            rating = np.full(len(numbers), NEGATIVE, np.float32)
            if rule.neutral_at is not None:
                rating[numbers >= rule.neutral_at] = RETRIEVAL_ONLY
            rating[numbers >= rule.positive_at] = POSITIVE
            weight = None
            classes = rating  # rows is None: counted row by row below
        for key, value in (("5", POSITIVE), ("3", RETRIEVAL_ONLY), ("1", NEGATIVE)):
            if rows is None:
                self.counts[key] += int((rating == value).sum())
            else:
                self.counts[key] += int(rows[classes == value].sum())
        return rating, weight

    def _remember(self, values: list[Any]) -> None:
        for value in values:
            if len(self.values) < 10 and value not in self.values:
                self.values.append(value)

    def check_some_positive(self, where: Path) -> None:
        if self.counts["5"] == 0:
            if self.spec.event is not None:
                rule = f"no row holds one of {self.spec.event.positive}"
            else:
                assert self.spec.rating is not None
                rule = f"no rating is >= {self.spec.rating.positive_at:g}"
            raise DataError(
                where,
                f"column {self.spec.rule_column!r}: no positive row: {rule} "
                f"(values found: {self.values})",
            )


def as_floats(values: pa.Array) -> np.ndarray:
    """Float64 values of a column, NaN where null or not a number."""
    if pa.types.is_integer(values.type) or pa.types.is_floating(values.type):
        return values.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
    if pa.types.is_boolean(values.type):
        return as_floats(values.cast(pa.int8()))
    text = pd.Series(values.cast(pa.string()).to_pandas(), dtype=object)
    return pd.to_numeric(text, errors="coerce").to_numpy(np.float64)
