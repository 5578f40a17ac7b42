"""Embedding tables whose gradient kind follows their size.

A sparse gradient (``sparse=True``, updated by ``LazyAdam`` in the rows a batch touched) pays
off only for large tables: for a table of a few thousand rows, a sparse optimizer's per-step
bookkeeping (coalesce, index, scatter per table) costs more than a dense Adam update of the
whole table. With the dense Adam fused (``make_optimizers``) the crossover lies near 20k rows
(SPARSE_MIN_ROWS; the profiles and timings behind it: docs/benchmarks/code-notes.md).
"""

from __future__ import annotations

from torch import nn

SPARSE_MIN_ROWS = 20_000


def embedding(rows: int, dim: int, padding_idx: int | None = None) -> nn.Embedding:
    """An ``nn.Embedding`` with sparse gradients when it has >= ``SPARSE_MIN_ROWS`` rows."""
    return nn.Embedding(rows, dim, padding_idx=padding_idx, sparse=rows >= SPARSE_MIN_ROWS)
