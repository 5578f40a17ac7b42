"""Embedding tables whose gradient kind follows their size.

A sparse gradient (``sparse=True``, updated by ``LazyAdam`` in the rows a batch touched) pays
off only for large tables: for a table of a few thousand rows, a sparse optimizer's per-step
bookkeeping (coalesce, index, scatter per table) costs more than a dense Adam update of the
whole table. Profiling the two-tower step on MovieLens put SparseAdam at ~45% of the step
with every table sparse. With the dense Adam fused (``make_optimizers``), the crossover at a
batch of 512-1024 rows lies near 20k rows: at 50k users x 1M items, making the two tables of
40-50k rows sparse sped DLRM's step up 1.2x and the two-tower's 1.2x, while at 20k items the
two-tower's step is faster with its 17k-row item table dense.
"""

from __future__ import annotations

from torch import nn

SPARSE_MIN_ROWS = 20_000


def embedding(rows: int, dim: int, padding_idx: int | None = None) -> nn.Embedding:
    """An ``nn.Embedding`` with sparse gradients when it has >= ``SPARSE_MIN_ROWS`` rows."""
    return nn.Embedding(rows, dim, padding_idx=padding_idx, sparse=rows >= SPARSE_MIN_ROWS)
