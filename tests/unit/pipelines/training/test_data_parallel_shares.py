"""Data-parallel shares, in one process: what each rank reads from the parquet loader and
from the two-tower's batches, and the launcher settings' checks (the ranks themselves run
in tests/integration/test_torchrun_*.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from core.errors import ConfigError
from pipelines.dataloader import ParquetBatchLoader
from pipelines.storage import write_parquet
from pipelines.training import distributed
from pipelines.training.distributed import Replicas
from pipelines.training.retrieval import TwoTowerBatches
from tests.unit.pipelines.training.test_retrieval import _data

ROWS = 10_007  # not a multiple of 2 or 3: the cut leaves rows out


def _parquet(tmp_path: Path, row_group_size: int) -> Path:
    path = tmp_path / "rows.parquet"
    write_parquet(path, {"row_id": np.arange(ROWS, dtype=np.int64)}, row_group_size)
    return path


def _epoch(path: Path, rank: int, world: int, batch: int = 100) -> list[np.ndarray]:
    loader = ParquetBatchLoader(
        [path],
        {"row_id": ["row_id"]},
        batch,
        buffer_chunks=2,
        dtypes={"row_id": torch.int64},
        seed=3,
        rank=rank,
        world=world,
    )
    batches = [b["row_id"][:, 0].numpy() for b in loader]
    assert len(batches) == len(loader)
    return batches


@pytest.mark.parametrize(("world", "row_group_size"), [(2, 1_000), (3, 1_000), (2, 65_536)])
def test_ranks_read_disjoint_equal_shares_of_every_row(
    tmp_path: Path, world: int, row_group_size: int
) -> None:
    path = _parquet(tmp_path, row_group_size)
    shares = [_epoch(path, rank, world) for rank in range(world)]
    ids = [np.concatenate(share) for share in shares]
    # the same batches on every rank (DDP steps together), the same rows in each
    assert len({len(share) for share in shares}) == 1
    assert all(len({len(batch) for batch in batches}) == 1 for batches in zip(*shares, strict=True))
    assert all(len(share) == ROWS // world for share in ids)
    together = np.concatenate(ids)
    assert len(np.unique(together)) == len(together)  # no row on two ranks
    assert len(together) == ROWS - ROWS % world  # all but the remainder of the cut


def test_a_rank_reads_only_the_row_groups_of_its_share(tmp_path: Path) -> None:
    path = _parquet(tmp_path, 1_000)
    loader = ParquetBatchLoader(
        [path], {"row_id": ["row_id"]}, 100, seed=3, rank=1, world=2, buffer_chunks=2
    )
    order = np.random.default_rng(3).permutation(len(loader.chunks))  # epoch 0's chunk order
    pieces = loader._share(order)
    assert len(pieces) <= len(loader.chunks) // 2 + 1  # its half, and one it shares at the cut
    assert sum(stop - first for _, first, stop in pieces) == ROWS // 2


def test_one_rank_of_one_is_the_plain_loader(tmp_path: Path) -> None:
    path = _parquet(tmp_path, 1_000)
    plain = ParquetBatchLoader(
        [path], {"row_id": ["row_id"]}, 100, buffer_chunks=2, dtypes={"row_id": torch.int64}, seed=3
    )
    alone = _epoch(path, 0, 1)
    for ours, theirs in zip(alone, plain, strict=True):
        np.testing.assert_array_equal(ours, theirs["row_id"][:, 0].numpy())


def test_a_rank_outside_the_world_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="rank 2 is not one of the 2 ranks"):
        _epoch(_parquet(tmp_path, 1_000), 2, 2)


def test_two_tower_shares_put_together_are_the_single_process_batches() -> None:
    """Each rank gathers its contiguous half of every global batch, with the same dropout
    draws as the single process; of an odd last batch, the last row is left out."""
    data = _data()
    options = {"batch": 64, "seed": 0, "history_dropout": 0.3, "user_id_dropout": 0.3}
    alone = list(TwoTowerBatches(data, **options).epoch(0))  # type: ignore[arg-type]
    halves = [
        list(TwoTowerBatches(data, **options, replicas=Replicas(r, 2)).epoch(0))  # type: ignore[arg-type]
        for r in range(2)
    ]
    assert len(halves[0]) == len(halves[1]) == len(alone)
    for single, first, second in zip(alone, *halves, strict=True):
        for whole, a, b in zip(single, first, second, strict=True):
            assert len(a) == len(b)
            torch.testing.assert_close(torch.cat([a, b]), whole[: 2 * len(a)], rtol=0, atol=0)
    assert len(alone[-1][0]) - 2 * len(halves[0][-1][0]) == len(data.positives["train"]) % 2


def test_a_global_batch_must_split_evenly() -> None:
    assert Replicas(1, 4).share(512, "--dlrm-batch") == 128
    with pytest.raises(ConfigError, match=r"--dlrm-batch 510 is the global batch.*multiple of 4"):
        Replicas(0, 4).share(510, "--dlrm-batch")


def test_the_launcher_settings_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert distributed.launched() == Replicas(1, 2)
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ConfigError, match=r"RANK 2 is not in 0\.\.WORLD_SIZE-1"):
        distributed.launched()
    monkeypatch.setenv("RANK", "one")
    with pytest.raises(ConfigError, match="must be integers"):
        distributed.launched()
    monkeypatch.setenv(distributed.TIMEOUT_ENV, "0")
    with pytest.raises(ConfigError, match="CASCADE_DIST_TIMEOUT_S must be a positive"):
        distributed.timeout()
    monkeypatch.setenv(distributed.TIMEOUT_ENV, "90")
    assert distributed.timeout().total_seconds() == 90


def test_alone_a_session_is_a_single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    with distributed.session() as place:
        assert place == Replicas() and distributed.is_main()
        # a step is a plain call, its place a single replica
        assert distributed.run_on_all(distributed.replicas) == Replicas()
