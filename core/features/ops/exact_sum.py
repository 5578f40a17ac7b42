"""Exact sums of floats per key, mergeable in any order: the fitted statistics of an op are
then the same whether its rows were summed at once or in parts (partitions on a cluster).

A float64 is an integer mantissa times a power of two. Rows are grouped by (key, exponent)
and the mantissas summed as integers (split in two halves so float64 ``bincount`` sums stay
exact), so no rounding happens until the end, where each key's sum is rounded once.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pandas as pd

_HALF = 26  # mantissa bits in the low half
_MASK = (1 << _HALF) - 1
_CHUNK = 1 << 12  # rows per pass: arrays under 64 KB stay in cache, and under the
# allocator's trim threshold (Dask's workers set it to 64 KB), so their memory is reused


def _added(codes: np.ndarray, values: np.ndarray, bins: int) -> np.ndarray:
    """int64 ``values`` added per code: by float64 ``bincount`` where no sum can reach
    2**52 (so it stays exact), else one by one."""
    if not values.any():
        return np.zeros(bins, np.int64)
    if float(np.abs(values).sum(dtype=np.float64)) < 2.0**52:
        return np.bincount(codes, values.astype(np.float64), bins).astype(np.int64)
    out = np.zeros(bins, np.int64)
    np.add.at(out, codes, values)
    return out


@dataclass(frozen=True)
class ExactSums:
    """Sum of values per key in ``range(size)``, held as integer mantissas per exponent:
    ``sum[key] = sum(((hi << 26) + lo) * 2**(exponent - 53))`` over that key's buckets."""

    size: int
    keys: np.ndarray  # int64 per bucket
    exponents: np.ndarray  # int64 per bucket
    hi: np.ndarray  # int64 per bucket
    lo: np.ndarray  # int64 per bucket

    @classmethod
    def of(
        cls, keys: np.ndarray | int, values: np.ndarray, size: int, squared: bool = False
    ) -> ExactSums:
        """Sums of finite ``values`` (of their squares with ``squared``: float32 values
        only, whose squares float64 holds exactly) grouped by ``keys`` (ints in
        ``range(size)``, or one int for every row)."""
        values = np.asarray(values)
        if values.dtype != np.float32:
            if squared:
                raise ValueError("exact sums of squares need float32 values")
            values = values.astype(np.float64, copy=False)
        if not np.isfinite(values).all():
            raise ValueError("exact sums need finite values")
        keys = np.asarray(keys, dtype=np.int64)
        parts = [
            cls._chunk(
                keys if keys.ndim == 0 else keys[start : start + _CHUNK],
                values[start : start + _CHUNK],
                size,
                squared,
            )
            for start in range(0, len(values), _CHUNK)
        ]
        return cls.merge(parts, size)

    @staticmethod
    def _split(values: np.ndarray, squared: bool) -> tuple[np.ndarray, np.ndarray]:
        """Integer mantissas and exponents from the bits: value (or its square) is
        ``mantissa * 2**(exponent - 53)``. Subnormals share the smallest exponent."""
        if values.dtype == np.float32:  # int64 throughout: mixed widths cast slowly
            bits = np.ascontiguousarray(values).view(np.int32).astype(np.int64)
            biased = (bits >> 23) & 0xFF
            magnitude = (bits & 0x7FFFFF) | (np.minimum(biased, 1) << 23)
            if squared:  # m**2 * 2**(2 * (e - 150)): below 2**48, exact
                return magnitude * magnitude, 2 * np.maximum(biased, 1) - 247
            exponent = np.maximum(biased, 1) - 97
        else:
            bits = np.ascontiguousarray(values).view(np.int64)
            biased = (bits >> 52) & 0x7FF
            magnitude = (bits & ((1 << 52) - 1)) | (np.minimum(biased, 1) << 52)
            exponent = np.maximum(biased, 1) - 1022
        sign = bits >> 63  # -1 where negative
        return (magnitude ^ sign) - sign, exponent

    @classmethod
    def _chunk(cls, keys: np.ndarray, values: np.ndarray, size: int, squared: bool) -> ExactSums:
        mantissa, exponent = cls._split(values, squared)
        nonzero = mantissa != 0
        if not nonzero.all():
            mantissa, exponent = mantissa[nonzero], exponent[nonzero]
            keys = keys if keys.ndim == 0 else keys[nonzero]
        keys = np.broadcast_to(keys, exponent.shape)
        return cls._grouped(keys, exponent, mantissa >> _HALF, mantissa & _MASK, size)

    @classmethod
    def merge(cls, parts: list[ExactSums], size: int | None = None) -> ExactSums:
        """The sums of all ``parts``' rows together (``size``: the largest part's by default)."""
        size = max((p.size for p in parts), default=0) if size is None else size
        if not parts:
            empty = np.zeros(0, np.int64)
            return cls(size, empty, empty, empty, empty)
        return cls._grouped(
            np.concatenate([p.keys for p in parts]),
            np.concatenate([p.exponents for p in parts]),
            np.concatenate([p.hi for p in parts]),
            np.concatenate([p.lo for p in parts]),
            size,
        )

    @classmethod
    def _grouped(
        cls, keys: np.ndarray, exponents: np.ndarray, hi: np.ndarray, lo: np.ndarray, size: int
    ) -> ExactSums:
        """Buckets of rows with the same key and exponent, their hi and lo parts added."""
        if not len(exponents):
            return cls(size, exponents, exponents, exponents, exponents)
        low = int(exponents.min())
        span = int(exponents.max()) - low + 1
        if size * span <= max(4 * len(exponents), 1 << 16):  # few buckets: index them directly
            codes = keys * span + (exponents - low)
            hi, lo = _added(codes, hi, size * span), _added(codes, lo, size * span)
            found = np.flatnonzero((hi != 0) | (lo != 0))  # a bucket summing to 0 adds nothing
            keys, exponents = found // span, found % span + low
        else:  # exponents within +-1100
            codes, uniques = pd.factorize(keys * 4096 + (exponents + 2048))
            hi, lo = _added(codes, hi, len(uniques)), _added(codes, lo, len(uniques))
            found = np.arange(len(uniques))
            buckets = np.asarray(uniques, dtype=np.int64)
            keys, exponents = buckets // 4096, buckets % 4096 - 2048
        hi, lo = hi[found], lo[found]
        hi += lo >> _HALF  # carry, so lo stays small however many parts are merged
        lo &= _MASK
        return cls(size, keys, exponents, hi, lo)

    def fractions(self) -> list[Fraction]:
        """Each key's exact sum."""
        return [Fraction(total) * Fraction(2) ** shift for total, shift in self._totals()]

    def floats(self) -> np.ndarray:
        """Each key's sum rounded once to float64 (0 for keys without rows).

        Where every bucket of a key is a multiple of 2**q and their magnitudes add up to
        less than 2**(52 + q), float64 adds them without rounding in any order: those keys
        are summed by ``bincount``; the others exactly, with Python ints.
        """
        out = np.zeros(self.size, dtype=np.float64)
        if not len(self.keys):
            return out
        with np.errstate(over="ignore"):  # keys beyond float64 go the exact way
            # the lowest set bit of each bucket's mantissa (hi << 26) + lo, without forming it
            lowest = np.where(
                self.lo != 0,
                np.frexp((self.lo & -self.lo).astype(np.float64))[1] - 1,
                np.frexp((self.hi & -self.hi).astype(np.float64))[1] - 1 + _HALF,
            )
            step = lowest + self.exponents - 53
            high = np.ldexp(self.hi.astype(np.float64), self.exponents - 53 + _HALF)
            low = np.ldexp(self.lo.astype(np.float64), self.exponents - 53)
            finest = np.full(self.size, np.iinfo(np.int64).max)
            np.minimum.at(finest, self.keys, step)
            bound = np.bincount(self.keys, np.abs(high) + low, self.size)
            fits = (
                (np.abs(self.hi) < 1 << 52)
                & (finest[self.keys] >= -1074)
                & (bound[self.keys] < np.ldexp(1.0, 52 + finest[self.keys]))
            )
        exact = np.ones(self.size, dtype=bool)
        exact[self.keys[~fits]] = False
        summed = np.bincount(self.keys, high + low, self.size)
        out[exact] = summed[exact]
        for key, (total, shift) in enumerate(self._totals(~exact[self.keys])):
            if total:  # int true division rounds correctly, however large the int
                out[key] = float(total << shift) if shift >= 0 else total / (1 << -shift)
        return out

    def _totals(self, chosen: np.ndarray | None = None) -> list[tuple[int, int]]:
        """Per key: an int total and a power of two, the sum being ``total * 2**shift``
        (only the ``chosen`` buckets; keys without any get ``(0, 0)``)."""
        totals = [(0, 0)] * self.size
        order = np.lexsort((-self.exponents, self.keys))  # per key, largest exponent first
        if chosen is not None:
            order = order[chosen[order]]
        for key, exponent, hi, lo in zip(
            self.keys[order].tolist(),
            self.exponents[order].tolist(),
            self.hi[order].tolist(),
            self.lo[order].tolist(),
            strict=True,
        ):
            total, shift = totals[key]
            mantissa = (hi << _HALF) + lo
            here = exponent - 53
            if total == 0:
                totals[key] = (mantissa, here)
            else:  # here <= shift: rescale the running total down to this exponent
                totals[key] = ((total << (shift - here)) + mantissa, here)
        return totals

    def regrouped(self, keys: np.ndarray, size: int) -> ExactSums:
        """These sums with bucket ``i`` moved to key ``keys[i]`` (merging what meets there),
        e.g. every key to 0 for the grand total."""
        moved = ExactSums(size, np.asarray(keys, np.int64), self.exponents, self.hi, self.lo)
        return ExactSums.merge([moved], size)

    def where(self, kept: np.ndarray) -> ExactSums:
        """Only the buckets where ``kept`` holds."""
        return ExactSums(
            self.size, self.keys[kept], self.exponents[kept], self.hi[kept], self.lo[kept]
        )
