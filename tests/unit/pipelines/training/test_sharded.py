"""The sharded trainer's pieces that need no second rank (2 ranks: tests/integration)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("torchrec")

from pipelines.training.sharded import Ranks, scatter_rows, sharding_types, share_bounds


def test_shares_cover_every_row_once_and_differ_by_at_most_one() -> None:
    for n, world in [(0, 2), (1, 2), (7, 3), (301, 2), (1024, 8)]:
        bounds = share_bounds(n, world)
        assert bounds[0] == 0 and bounds[-1] == n and len(bounds) == world + 1
        sizes = np.diff(bounds)
        assert sizes.min() >= 0 and sizes.max() - sizes.min() <= 1


def test_cpu_shards_table_or_column_wise_and_gpu_row_wise() -> None:
    assert set(sharding_types(torch.device("cpu"))) == {"table_wise", "column_wise"}
    assert sharding_types(torch.device("cuda", 0)) == ["row_wise"]


def test_rank_zero_without_rows_to_score_is_an_error() -> None:
    with pytest.raises(ValueError, match="rank 0 must pass the rows to score"):
        scatter_rows(None, Ranks(0, 1, torch.device("cpu")))


def test_alone_the_share_is_everything() -> None:
    rows = {"sparse": np.arange(6).reshape(3, 2), "dense": np.ones((3, 1), np.float32)}
    share, n = scatter_rows(rows, Ranks(0, 1, torch.device("cpu")))
    assert n == 3 and all(np.array_equal(share[k], rows[k]) for k in rows)
