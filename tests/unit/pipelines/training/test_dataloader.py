from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from core.errors import ConfigError
from pipelines.dataloader import ParquetBatchLoader
from pipelines.storage import flatten, write_parquet

ROWS = 10_000


@pytest.fixture
def parquet(tmp_path: Path) -> Path:
    """Rows whose every column is derived from a row id, so batches can be checked row by row."""
    row_id = np.arange(ROWS, dtype=np.int64)
    columns = {
        "row_id": row_id,
        "cat": np.stack([row_id * 3 + j for j in range(4)], axis=1),
        "dense": np.stack([row_id * 0.5 + j for j in range(3)], axis=1).astype(np.float32),
        "label": (row_id % 2).astype(np.float32),
    }
    path = tmp_path / "rows.parquet"
    write_parquet(path, flatten(columns, ["row_id", "cat", "dense", "label"]), row_group_size=1_000)
    return path


GROUPS = {"row_id": ["row_id"], "cat": ["cat"], "dense": ["dense"], "label": ["label"]}


def _ids(loader: ParquetBatchLoader) -> np.ndarray:
    return np.concatenate([b["row_id"][:, 0].numpy() for b in loader])


@pytest.mark.parametrize("workers", [1, 3])
def test_each_row_once_per_epoch_with_consistent_columns(parquet: Path, workers: int) -> None:
    loader = ParquetBatchLoader(
        [parquet],
        GROUPS,
        batch_size=256,
        buffer_chunks=3,
        dtypes={"row_id": torch.int64, "cat": torch.int64},
        workers=workers,
    )
    seen = []
    for batch in loader:
        row_id = batch["row_id"][:, 0]
        assert batch["cat"].shape == (len(row_id), 4) and batch["dense"].shape == (len(row_id), 3)
        torch.testing.assert_close(batch["cat"][:, 2], row_id * 3 + 2)
        torch.testing.assert_close(batch["dense"][:, 1], row_id.float() * 0.5 + 1)
        torch.testing.assert_close(batch["label"][:, 0], (row_id % 2).float())
        seen.append(row_id.numpy())
    ids = np.concatenate(seen)
    assert np.array_equal(np.sort(ids), np.arange(ROWS))
    assert not np.array_equal(ids, np.arange(ROWS))  # shuffled
    assert len(seen) == len(loader) == -(-ROWS // 256)
    assert all(len(s) == 256 for s in seen[:-1]) and len(seen[-1]) == ROWS % 256


def test_epochs_differ_and_runs_repeat_for_a_seed(parquet: Path) -> None:
    def make() -> ParquetBatchLoader:
        return ParquetBatchLoader([parquet], GROUPS, 500, dtypes={"row_id": torch.int64}, seed=4)

    loader = make()
    first, second = _ids(loader), _ids(loader)
    assert not np.array_equal(first, second)
    assert np.array_equal(first, _ids(make()))


def test_rows_mix_across_chunks_within_a_buffer(parquet: Path) -> None:
    loader = ParquetBatchLoader(
        [parquet], GROUPS, 1_000, buffer_chunks=4, dtypes={"row_id": torch.int64}
    )
    batch = next(iter(loader))["row_id"][:, 0].numpy()
    assert len(np.unique(batch // 1_000)) >= 3  # rows of several row groups in one batch


def test_without_shuffle_order_is_preserved(parquet: Path) -> None:
    loader = ParquetBatchLoader(
        [parquet], GROUPS, 333, shuffle=False, dtypes={"row_id": torch.int64}
    )
    assert np.array_equal(_ids(loader), np.arange(ROWS))


def test_drop_last_and_several_files(parquet: Path, tmp_path: Path) -> None:
    loader = ParquetBatchLoader(
        [parquet, parquet], GROUPS, 3_000, drop_last=True, dtypes={"row_id": torch.int64}
    )
    sizes = [len(b["label"]) for b in loader]
    assert sizes == [3_000] * 6 and len(loader) == 6


def test_batches_stay_valid_after_later_batches(parquet: Path) -> None:
    loader = ParquetBatchLoader(
        [parquet], GROUPS, 700, buffer_chunks=1, dtypes={"row_id": torch.int64, "cat": torch.int64}
    )
    batches = list(loader)
    for batch in batches:
        torch.testing.assert_close(batch["cat"][:, 0], batch["row_id"][:, 0] * 3)


def test_stopping_early_does_not_hang(parquet: Path) -> None:
    loader = ParquetBatchLoader([parquet], GROUPS, 100, buffer_chunks=1)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert len(_ids(loader)) == ROWS  # and the loader is reusable


def test_bad_arguments_are_named(parquet: Path) -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        ParquetBatchLoader([parquet], GROUPS, 0)
    with pytest.raises(ConfigError, match="at least one parquet file"):
        ParquetBatchLoader([], GROUPS, 10)
    with pytest.raises(KeyError, match="no column or column group 'nope'"):
        ParquetBatchLoader([parquet], {"x": ["nope"]}, 10)


def test_a_read_error_in_the_reader_thread_reaches_the_consumer(
    parquet: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loader = ParquetBatchLoader([parquet], GROUPS, 100, shuffle=False)

    class BrokenFile:
        def read_row_group(self, *args: object, **kwargs: object) -> None:
            raise OSError("disk went away")

    monkeypatch.setattr(loader, "_open", lambda: [BrokenFile()])
    with pytest.raises(OSError, match="disk went away"):
        list(loader)


def test_rewriting_the_file_does_not_break_a_running_loader(parquet: Path) -> None:
    loader = ParquetBatchLoader([parquet], GROUPS, 1_000, dtypes={"row_id": torch.int64})
    iterator = iter(loader)
    first = next(iterator)["row_id"]
    write_parquet(parquet, {"row_id": np.zeros(5, dtype=np.int64)})  # replaced, not truncated
    rest = [b["row_id"] for b in iterator]
    ids = torch.cat([first, *rest])[:, 0].numpy()
    assert np.array_equal(np.sort(ids), np.arange(ROWS))
