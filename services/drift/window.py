"""Sliding-window counts of one served version: monitored-quantity bins and served items.

The window is a ring of ``slots`` sub-windows, each tagged with its epoch
(``floor(now / slot_s)``); a slot whose tag is older than the current epoch is zeroed when it
is next written, and only slots of the last ``slots`` epochs are read. Everything a request
adds is vectorised: one broadcast comparison bins all quantities of a block at once (edges
padded with +inf, so ``(value >= edges).sum()`` equals ``searchsorted(edges, value,
"right")``; a NaN lands in the lowest bin), then one ``bincount`` into the slot.

Served items: ``last_epoch[position]`` is the epoch in which the item was last served (int32,
4 bytes per catalog item: 4 MB per version at 1M items), so the window's coverage is
``(last_epoch > now_epoch - slots).mean()``; popularity sums per slot give the mean.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.export.drift_reference import ITEM_QUANTITIES, USER_QUANTITIES, Reference

PSI_EPSILON = 1e-4  # share used for an empty bin (either side), as Evidently does
NEVER = np.iinfo(np.int32).min


def psi(counts: np.ndarray, reference: np.ndarray, epsilon: float = PSI_EPSILON) -> float:
    """Population stability index ``sum((a - r) * ln(a / r))`` of window ``counts`` against
    reference shares; zero shares on either side are replaced by ``epsilon``."""
    actual = counts / counts.sum()
    actual = np.where(actual == 0, epsilon, actual)
    expected = np.where(reference == 0, epsilon, reference)
    return float(np.sum((actual - expected) * np.log(actual / expected)))


def js_distance(counts: np.ndarray, reference: np.ndarray) -> float:
    """Jensen-Shannon distance, base 2 (scipy.spatial.distance.jensenshannon's convention):
    both sides normalised, ``0 * log 0 = 0``."""
    p = counts / counts.sum()
    q = reference / reference.sum()
    m = (p + q) / 2

    def kl(a: np.ndarray) -> float:
        inside = a > 0
        return float(np.sum(a[inside] * np.log2(a[inside] / m[inside])))

    return float(np.sqrt(max((kl(p) + kl(q)) / 2, 0.0)))


@dataclass
class QuantityStats:
    """One quantity's drift over the window."""

    psi: float
    js_distance: float
    samples: int


def _edges(references: list[Reference], width: int) -> np.ndarray:
    edges = np.full((len(references), width), np.inf)
    for row, reference in enumerate(references):
        edges[row, : len(reference.edges)] = reference.edges
    return edges


class VersionWindow:
    """The window of one version (single-threaded: used from the event loop only)."""

    def __init__(
        self,
        references: dict[str, Reference],
        percentiles: np.ndarray,
        history_length: int,
        slots: int,
        slot_s: float,
    ) -> None:
        self.user_columns = [i for i, q in enumerate(USER_QUANTITIES) if q in references]
        self.item_columns = [i for i, q in enumerate(ITEM_QUANTITIES) if q in references]
        self.names = [USER_QUANTITIES[i] for i in self.user_columns] + [
            ITEM_QUANTITIES[i] for i in self.item_columns
        ]
        self.references = [references[name] for name in self.names]
        width = max((len(r.edges) for r in self.references), default=0)
        self.bins = width + 1
        self.user_edges = _edges(self.references[: len(self.user_columns)], width)
        self.item_edges = _edges(self.references[len(self.user_columns) :], width)
        self.item_offsets = (len(self.user_columns) + np.arange(len(self.item_columns))) * self.bins
        self.user_offsets = np.arange(len(self.user_columns)) * self.bins
        self.percentiles = percentiles.astype(np.float32)
        self.history_length = history_length
        self.slots, self.slot_s = slots, slot_s
        self.counts = np.zeros((slots, len(self.names) * self.bins), np.int64)
        self.popularity_sum = np.zeros(slots)
        self.served = np.zeros(slots, np.int64)
        self.slot_epoch = np.full(slots, NEVER, np.int64)
        self.last_epoch = np.full(len(percentiles), NEVER, np.int32)

    def _slot(self, now: float) -> tuple[int, int]:
        epoch = int(now // self.slot_s)
        slot = epoch % self.slots
        if self.slot_epoch[slot] != epoch:
            self.counts[slot] = 0
            self.popularity_sum[slot] = 0.0
            self.served[slot] = 0
            self.slot_epoch[slot] = epoch
        return slot, epoch

    def add(self, user: np.ndarray, items: np.ndarray, now: float) -> None:
        """Count one request: ``user [len(USER_QUANTITIES)]`` and ``items [rows,
        len(ITEM_QUANTITIES)]`` (both in the contract's column order)."""
        slot, _ = self._slot(now)
        user = user[self.user_columns]
        items = items[:, self.item_columns]
        user_bins = (user[:, None] >= self.user_edges).sum(axis=1) + self.user_offsets
        item_bins = (items[:, :, None] >= self.item_edges[None]).sum(axis=2) + self.item_offsets
        flat = np.concatenate([user_bins, item_bins.ravel()])
        self.counts[slot] += np.bincount(flat, minlength=self.counts.shape[1])

    def add_served(self, positions: np.ndarray, now: float) -> None:
        """Record the catalog positions one answer showed."""
        slot, epoch = self._slot(now)
        self.last_epoch[positions] = epoch
        self.popularity_sum[slot] += float(self.percentiles[positions].sum())
        self.served[slot] += len(positions)

    def _live(self, now: float) -> tuple[np.ndarray, int]:
        epoch = int(now // self.slot_s)
        return self.slot_epoch > epoch - self.slots, epoch

    def window_counts(self, now: float) -> np.ndarray:
        """``[quantities, bins]`` counts of the window (padding bins are always 0)."""
        live, _ = self._live(now)
        return self.counts[live].sum(axis=0).reshape(len(self.names), self.bins)

    def stats(self, now: float) -> dict[str, QuantityStats]:
        """PSI, JS distance and sample count per quantity (NaN statistics without samples)."""
        out = {}
        for name, reference, counts in zip(
            self.names, self.references, self.window_counts(now), strict=True
        ):
            counts = counts[: len(reference.proportions)].astype(np.float64)
            total = int(counts.sum())
            if total == 0:
                out[name] = QuantityStats(float("nan"), float("nan"), 0)
                continue
            out[name] = QuantityStats(
                psi(counts, reference.proportions),
                js_distance(counts, reference.proportions),
                total,
            )
        return out

    def coverage(self, now: float) -> float:
        """Distinct catalog items served in the window / catalog size."""
        _, epoch = self._live(now)
        if len(self.last_epoch) == 0:
            return 0.0
        return float(np.count_nonzero(self.last_epoch > epoch - self.slots) / len(self.last_epoch))

    def popularity_mean(self, now: float) -> float | None:
        """Mean popularity percentile of the items served in the window (None: none served)."""
        live, _ = self._live(now)
        served = int(self.served[live].sum())
        return float(self.popularity_sum[live].sum() / served) if served else None
