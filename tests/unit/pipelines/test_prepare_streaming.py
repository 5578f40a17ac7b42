"""The streaming prepare writes what the in-memory prepare writes, a partition at a time."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from core.errors import UsageError
from core.features.workflow import Workflow
from pipelines.config import TrainConfig
from pipelines.data.dataset_file import load_dataset_file
from pipelines.data.ingest import ingest, load_ingested
from pipelines.pipeline import streams
from pipelines.prepare import SPLITS, RetrievalData, prepare
from pipelines.prepare_streaming import describe, prepare_ingested

SHOP = Path(__file__).resolve().parents[3] / "examples" / "shop"
GROUP_ROWS = 6_000  # the shop's ~63k events in about 11 partitions


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shop sample ingested (string ids, weighted events, every kind of feature, cold
    start items), its interactions rewritten in small row groups: many partitions."""
    data = tmp_path_factory.mktemp("shop") / "data"
    ingest(load_dataset_file(SHOP / "dataset.yaml"), data)
    for part in sorted((data / "interactions").glob("part-*.parquet")):
        table = pq.read_table(part)
        pq.write_table(table, part, row_group_size=GROUP_ROWS)
    return data


@pytest.fixture(scope="module")
def both(shop: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    in_memory, streamed = tmp_path_factory.mktemp("memory"), tmp_path_factory.mktemp("streamed")
    prepare(load_ingested(shop), in_memory, seed=3, history_length=5)
    lines: list[str] = []
    prepare_ingested(
        shop,
        streamed,
        seed=3,
        history_length=5,
        rows=GROUP_ROWS,
        bucket_rows=10_000,
        log=lines.append,
    )
    assert "prepare: encoded partition 11 of 11" in lines
    assert not (streamed / "prepare.scratch").exists()
    return in_memory, streamed


def test_long_passes_print_progress_lines(
    shop: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pipelines.progress as progress

    monkeypatch.setattr(progress, "PROGRESS_S", 0.0)  # a line whenever one may be printed
    lines: list[str] = []
    prepare_ingested(
        shop, tmp_path, seed=3, history_length=5, rows=GROUP_ROWS, bucket_rows=10_000,
        log=lines.append,
    )  # fmt: skip
    fitting = [line for line in lines if line.startswith("prepare: fitting stage 1 of ")]
    assert [line.rsplit(": ", 1)[1] for line in fitting] == [
        f"partition {n} of 11" for n in range(1, 12)
    ]
    histories = [line for line in lines if line.startswith("prepare: histories: bucket ")]
    assert histories and histories[-1].endswith(" of 7"), histories


def test_the_workflow_is_the_same(both: tuple[Path, Path]) -> None:
    left, right = (Workflow.load(p / "workflow") for p in both)
    assert [op.config() for op in left.ops] == [op.config() for op in right.ops]
    for a, b in zip(left.ops, right.ops, strict=True):
        arrays = a.arrays()
        assert arrays.keys() == b.arrays().keys()
        for name, values in arrays.items():
            np.testing.assert_array_equal(values, b.arrays()[name], err_msg=f"{a.kind}/{name}")


def test_ranking_rows_are_the_same(both: tuple[Path, Path]) -> None:
    in_memory, streamed = both
    for name in ("valid", "test"):  # in row order, row groups alike
        left = pq.read_table(in_memory / f"ranking_{name}.parquet")
        right = pq.read_table(streamed / f"ranking_{name}.parquet")
        assert left.equals(right), name
    left = pq.read_table(in_memory / "ranking_train.parquet").to_pandas()
    right = pq.read_table(streamed / "ranking_train.parquet").to_pandas()
    assert "weight" in left.columns  # the shop weighs purchases: the rows carry it
    assert not left.equals(right)  # another order ...
    columns = list(left.columns)
    pd.testing.assert_frame_equal(  # ... of the same rows
        left.sort_values(columns, ignore_index=True), right.sort_values(columns, ignore_index=True)
    )


def test_retrieval_inputs_are_the_same(both: tuple[Path, Path]) -> None:
    left, right = (RetrievalData.load(p / "retrieval.npz") for p in both)
    for name in ("user_ids", "item_ids", "user_features", "history", "item_features"):
        np.testing.assert_array_equal(getattr(left, name), getattr(right, name), err_msg=name)
    np.testing.assert_array_equal(left.item_dense, right.item_dense)
    np.testing.assert_array_equal(left.item_log_q, right.item_log_q)
    assert left.history.any()
    for name in SPLITS:
        np.testing.assert_array_equal(left.positives[name], right.positives[name], err_msg=name)


def test_online_tables_are_the_same(both: tuple[Path, Path]) -> None:
    in_memory, streamed = both
    for name in ("user_ids", "item_ids", "users", "items"):
        pd.testing.assert_frame_equal(
            pd.read_parquet(in_memory / "online" / f"{name}.parquet"),
            pd.read_parquet(streamed / "online" / f"{name}.parquet"),
        )
    left = pd.read_parquet(in_memory / "online" / "histories.parquet")
    right = pd.read_parquet(streamed / "online" / "histories.parquet")
    assert left["user_id"].tolist() == right["user_id"].tolist()
    for column in ("seen", "recent"):
        assert [list(v) for v in left[column]] == [list(v) for v in right[column]], column


def test_described_without_loading(shop: Path) -> None:
    raw = load_ingested(shop)
    info = describe(shop)
    assert info.data_hash == raw.content_hash()
    assert info.newest_timestamp == int(raw.interactions["timestamp"].max())
    assert (info.users, info.items, info.interactions) == (
        len(raw.users),
        len(raw.items),
        len(raw.interactions),
    )


def test_a_second_run_replaces_the_first(shop: Path, both: tuple[Path, Path]) -> None:
    _, streamed = both
    again = streamed.parent / "again"
    shutil.copytree(streamed, again)
    prepare_ingested(shop, again, seed=3, history_length=5, log=lambda _: None)
    assert pq.read_table(again / "ranking_test.parquet").equals(
        pq.read_table(streamed / "ranking_test.parquet")
    )


def test_when_the_prepare_streams() -> None:
    auto = TrainConfig()
    assert not streams(auto, 1.0, 1_000)
    assert streams(auto, 1.0, 30_000_000)
    assert not streams(auto, 0.5, 30_000_000)  # the oldest rows only: in memory
    assert not streams(TrainConfig(split_protocol="per_user"), 1.0, 30_000_000)
    assert not streams(TrainConfig(streaming_prepare="off"), 1.0, 30_000_000)
    assert streams(TrainConfig(streaming_prepare="on"), 1.0, 10)
    with pytest.raises(UsageError, match="--split-protocol global"):
        TrainConfig(streaming_prepare="on", split_protocol="per_user")
    with pytest.raises(UsageError, match="--fit-workers"):
        TrainConfig(streaming_prepare="on", fit_workers=2)


def test_cascade_train_prepare_streams_on_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli.main import main

    workdir = tmp_path / "work"
    argv = ["train", "prepare", "--data", str(SHOP / "dataset.yaml"), "--workdir", str(workdir)]
    assert main([*argv, "--streaming-prepare", "on"]) == 0
    assert "interactions (prepared a partition at a time)" in capsys.readouterr().out
    info = json.loads((workdir / "dataset.json").read_text())
    raw = load_ingested(workdir / "data")
    assert info["data_hash"] == raw.content_hash() and info["dataset"] == "shop"
    assert (workdir / "retrieval.npz").is_file() and (workdir / "ranking_train.parquet").is_file()
    assert main([*argv, "--streaming-prepare", "on", "--base-fraction", "0.5"]) == 2
    assert "--base-fraction" in capsys.readouterr().err
    assert info == json.loads((workdir / "dataset.json").read_text())  # nothing was redone


def test_cascade_retrain_refuses_the_streaming_prepare(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from cli.main import main

    monkeypatch.delenv("CASCADE_REDIS__URL", raising=False)  # the file registry
    argv = ["retrain", "--dataset", "synthetic", "--artifacts", str(tmp_path)]
    assert main([*argv, "--streaming-prepare", "on"]) == 2
    assert "cascade retrain prepares in memory" in capsys.readouterr().err
