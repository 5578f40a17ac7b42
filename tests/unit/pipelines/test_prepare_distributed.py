"""Merging the workers' ranking pieces into one file: in order for validation and test, and
for training rows a proportional draw from every piece per row group."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from core.errors import ConfigError
from pipelines.data.synthetic import make_synthetic
from pipelines.prepare import prepare
from pipelines.ranking_files import merge_pieces, shares
from pipelines.split import per_user_split
from pipelines.storage import write_parquet

SIZES = (10, 7, 0, 25)  # an empty piece: a partition with no rows of the split


def _pieces(tmp_path: Path) -> tuple[list[Path], np.ndarray]:
    paths, start = [], 0
    for i, n in enumerate(SIZES):
        path = tmp_path / f"part-{i}.parquet"
        ids = np.arange(start, start + n, dtype=np.int64)
        write_parquet(path, {"row": ids, "piece": np.full(n, i, np.int32)}, row_group_size=4)
        paths.append(path)
        start += n
    return paths, np.arange(start)


def test_pieces_in_order_are_concatenated(tmp_path: Path) -> None:
    paths, rows = _pieces(tmp_path)
    merge_pieces(paths, tmp_path / "out.parquet", None, group_rows=8)
    out = pq.ParquetFile(tmp_path / "out.parquet")
    assert out.read().column("row").to_numpy().tolist() == rows.tolist()
    groups = [out.metadata.row_group(g).num_rows for g in range(out.metadata.num_row_groups)]
    assert groups == [8, 8, 8, 8, 8, 2]


def test_shuffled_groups_draw_from_every_piece_in_proportion(tmp_path: Path) -> None:
    paths, rows = _pieces(tmp_path)
    merge_pieces(paths, tmp_path / "out.parquet", np.random.default_rng(0), group_rows=21)
    out = pq.ParquetFile(tmp_path / "out.parquet")
    table = out.read()
    assert sorted(table.column("row").to_numpy().tolist()) == rows.tolist()
    assert table.column("row").to_numpy().tolist() != rows.tolist()
    first = out.read_row_group(0).column("piece").to_numpy()
    # 21 of 42 rows: half of each piece, 3.5 and 12.5 rounded by largest remainder (tie: first)
    assert np.bincount(first, minlength=4).tolist() == [5, 4, 0, 12]


def test_shares_add_up_and_never_exceed_what_is_left() -> None:
    remaining = np.array([10, 7, 0, 25, 1])
    for rows in range(1, int(remaining.sum()) + 1):
        take = shares(remaining, rows)
        assert take.sum() == rows
        assert np.all(take <= remaining) and np.all(take >= 0)


def test_a_split_other_than_the_hashed_one_is_refused(tmp_path: Path) -> None:
    """Before any cluster starts: a worker splits its rows by their own hash only."""
    dataset = make_synthetic(n_users=40, n_items=30, n_interactions=600, seed=1)
    split = per_user_split(dataset.interactions["user_id"].to_numpy(), 0)
    with pytest.raises(ConfigError, match="hashed split only"):
        prepare(dataset, tmp_path, split=split, fit_workers=2)


def test_without_the_distributed_extra_the_error_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    import pipelines

    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed fails
    monkeypatch.delitem(sys.modules, "pipelines.prepare_distributed")
    monkeypatch.delattr(pipelines, "prepare_distributed")
    dataset = make_synthetic(n_users=40, n_items=30, n_interactions=600, seed=1)
    with pytest.raises(ConfigError, match=r"distributed extra \(distributed is not installed\)"):
        prepare(dataset, tmp_path, dask_scheduler="tcp://127.0.0.1:8786")


def test_zero_workers_is_refused_not_rounded_up(tmp_path: Path) -> None:
    dataset = make_synthetic(n_users=40, n_items=30, n_interactions=600, seed=1)
    with pytest.raises(ValueError, match="workers must be at least 1"):
        prepare(dataset, tmp_path, fit_workers=0)
