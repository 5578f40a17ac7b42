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
_CHUNK = 1 << 25  # rows summed by one float64 bincount: 2^27 x 2^25 < 2^53, still exact


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
    def of(cls, keys: np.ndarray, values: np.ndarray, size: int) -> ExactSums:
        """Sums of finite ``values`` grouped by ``keys`` (ints in ``range(size)``)."""
        keys = np.asarray(keys, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        if not np.isfinite(values).all():
            raise ValueError("exact sums need finite values")
        parts = [
            cls._chunk(keys[start : start + _CHUNK], values[start : start + _CHUNK], size)
            for start in range(0, len(values), _CHUNK)
        ]
        return cls.merge(parts, size)

    @classmethod
    def _chunk(cls, keys: np.ndarray, values: np.ndarray, size: int) -> ExactSums:
        fraction, exponent = np.frexp(values)
        mantissa = np.ldexp(fraction, 53).astype(np.int64)  # exact: 53 significant bits
        nonzero = mantissa != 0
        keys, mantissa, exponent = keys[nonzero], mantissa[nonzero], exponent[nonzero]
        bucket = keys * 4096 + (exponent.astype(np.int64) + 2048)  # exponents within +-1100
        codes, uniques = pd.factorize(bucket)
        hi = np.bincount(codes, weights=(mantissa >> _HALF).astype(np.float64))
        lo = np.bincount(codes, weights=(mantissa & _MASK).astype(np.float64))
        found = np.asarray(uniques, dtype=np.int64)
        return cls(
            size, found // 4096, found % 4096 - 2048, hi.astype(np.int64), lo.astype(np.int64)
        )

    @classmethod
    def merge(cls, parts: list[ExactSums], size: int | None = None) -> ExactSums:
        """The sums of all ``parts``' rows together (``size``: the largest part's by default)."""
        size = max((p.size for p in parts), default=0) if size is None else size
        keys = np.concatenate([p.keys for p in parts]) if parts else np.zeros(0, np.int64)
        exponents = np.concatenate([p.exponents for p in parts]) if parts else keys
        codes, uniques = pd.factorize(keys * 4096 + (exponents + 2048))
        hi = np.zeros(len(uniques), np.int64)
        lo = np.zeros(len(uniques), np.int64)
        if parts:
            np.add.at(hi, codes, np.concatenate([p.hi for p in parts]))
            np.add.at(lo, codes, np.concatenate([p.lo for p in parts]))
        hi += lo >> _HALF  # carry, so lo stays small however many parts are merged
        lo &= _MASK
        found = np.asarray(uniques, dtype=np.int64)
        return cls(size, found // 4096, found % 4096 - 2048, hi, lo)

    def fractions(self) -> list[Fraction]:
        """Each key's exact sum."""
        return [Fraction(total) * Fraction(2) ** shift for total, shift in self._totals()]

    def floats(self) -> np.ndarray:
        """Each key's sum rounded once to float64 (0 for keys without rows)."""
        out = np.zeros(self.size, dtype=np.float64)
        for key, (total, shift) in enumerate(self._totals()):
            if total:  # int true division rounds correctly, however large the int
                out[key] = float(total << shift) if shift >= 0 else total / (1 << -shift)
        return out

    def _totals(self) -> list[tuple[int, int]]:
        """Per key: an int total and a power of two, the sum being ``total * 2**shift``."""
        totals = [(0, 0)] * self.size
        order = np.lexsort((-self.exponents, self.keys))  # per key, largest exponent first
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
