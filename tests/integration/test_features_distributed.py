"""The feature workflow fitted on a real 2-worker Dask LocalCluster equals the in-memory fit
exactly: vocabularies, counts, target encodings, group means and standardisation, the
encoded training rows (out-of-fold target encoding included) and transformed held-out rows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from distributed import Client, LocalCluster

from core.errors import DataError
from core.features.ops import Columns
from core.features.rows import AttributeTable, labelled_rows
from core.features.spec import build_workflow
from core.features.workflow import Workflow
from pipelines import features_distributed as distributed
from pipelines.data.dataset_file import load_dataset_file
from pipelines.data.ingest import ingest, load_ingested
from pipelines.data.schema import RawDataset
from pipelines.data.synthetic import make_synthetic
from pipelines.partitions import read_schema, write_partitions
from pipelines.split import hashed_split

pytestmark = pytest.mark.integration

SHOP = Path(__file__).resolve().parents[2] / "examples" / "shop" / "dataset.yaml"
SEED = 4


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with distributed.dask_client(workers=2) as client:
        yield client


def _in_memory(dataset: RawDataset, seed: int) -> tuple[Workflow, Columns, Columns]:
    """What ``prepare`` does: the workflow fitted on the hashed split's training rows, the
    encoded training rows and the transformed validation rows."""
    schema = dataset.schema
    users = AttributeTable(dataset.users, "user_id", schema.user_attributes)
    items = AttributeTable(dataset.items, "item_id", schema.item_attributes)
    rows = labelled_rows(dataset.interactions, users, items)
    split = hashed_split(dataset.interactions, seed)
    workflow = build_workflow(schema, seed=seed)
    train = workflow.fit_transform({k: v[split.train] for k, v in rows.items()})
    valid = workflow.transform({k: v[split.valid] for k, v in rows.items()})
    return workflow, train, valid


def _assert_same(expected: Workflow, fitted: Workflow) -> None:
    assert [op.config() for op in expected.ops] == [op.config() for op in fitted.ops]
    for a, b in zip(expected.ops, fitted.ops, strict=True):
        left, right = a.arrays(), b.arrays()
        assert left.keys() == right.keys()
        for name in left:
            assert left[name].dtype == right[name].dtype, (a.kind, name)
            np.testing.assert_array_equal(left[name], right[name], err_msg=f"{a.kind}/{name}")


def _assert_rows(expected: Columns, parts: list[Columns]) -> None:
    assert sum(len(p["label"]) for p in parts) == len(expected["label"])
    for column, values in expected.items():
        joined = np.concatenate([p[column] for p in parts])
        if values.dtype == object:  # raw attributes: None stays None
            assert joined.tolist() == values.tolist(), column
        else:
            assert joined.dtype == values.dtype, column
            np.testing.assert_array_equal(joined, values, err_msg=column)


def _check(client: Client, directory: Path, dataset: RawDataset, rows: int) -> None:
    expected, train, valid = _in_memory(dataset, SEED)
    workflow = build_workflow(read_schema(directory), seed=SEED)
    parts = distributed.load_rows(client, directory, "train", SEED, rows=rows)
    assert len(parts) >= 4  # several partitions, spread over both workers
    encoded = distributed.fit(client, parts, workflow)
    _assert_same(expected, workflow)
    _assert_rows(train, client.gather(encoded))
    held_out = distributed.load_rows(client, directory, "valid", SEED, rows=rows)
    _assert_rows(valid, client.gather(distributed.transform(client, held_out, workflow)))


def test_shop_sample_fits_the_same_on_the_cluster(client: Client, tmp_path: Path) -> None:
    """Every kind of feature (string ids, min_frequency, multi-categorical with its own
    separator, a float price averaged per user, weights) from a real ingest, its one
    interactions file rewritten as three files of small row groups."""
    directory = tmp_path / "shop"
    ingest(load_dataset_file(SHOP), directory)
    (only,) = sorted((directory / "interactions").glob("part-*.parquet"))
    table = pq.read_table(only)
    only.unlink()
    third = -(-table.num_rows // 3)
    for number in range(3):
        piece = table.slice(number * third, third)
        pq.write_table(
            piece, directory / "interactions" / f"part-{number:05d}.parquet", row_group_size=2_000
        )
    dataset = load_ingested(directory)
    assert any(f.kind == "numeric" for f in dataset.schema.item)
    _check(client, directory, dataset, rows=4_000)


def test_synthetic_fits_the_same_on_the_cluster(client: Client, tmp_path: Path) -> None:
    dataset = make_synthetic(n_users=800, n_items=600, n_interactions=40_000, seed=2)
    write_partitions(dataset, tmp_path, file_rows=15_000, group_rows=5_000)
    _check(client, tmp_path, dataset, rows=5_000)
    expected, _, _ = _in_memory(dataset, SEED)
    _assert_same(expected, distributed.fit_ingested(client, tmp_path, seed=SEED, rows=5_000))


def test_stages_group_ops_that_read_no_output_of_each_other() -> None:
    dataset = make_synthetic(n_users=50, n_items=40, n_interactions=500, seed=1)
    stages = distributed.stages(build_workflow(dataset.schema).ops)
    kinds = [sorted({op.kind for op in stage}) for stage in stages]
    assert kinds == [
        ["categorify", "multi_hot", "temporal"],
        ["count_encode", "group_mean", "target_encode"],
        ["standardize"],
    ]


def test_partitions_are_whole_row_groups_in_file_order(tmp_path: Path) -> None:
    dataset = make_synthetic(n_users=50, n_items=40, n_interactions=1_000, seed=1)
    write_partitions(dataset, tmp_path, file_rows=600, group_rows=100)
    parts = distributed.partitions(tmp_path, rows=250)
    assert [(p.path.name, p.groups) for p in parts] == [
        ("part-00000.parquet", (0, 1)),
        ("part-00000.parquet", (2, 3)),
        ("part-00000.parquet", (4, 5)),
        ("part-00001.parquet", (0, 1)),
        ("part-00001.parquet", (2, 3)),
    ]


def test_bad_input_is_named(client: Client, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not an ingested data set"):
        distributed.partitions(tmp_path)
    with pytest.raises(DataError, match=r"schema\.json"):
        read_schema(tmp_path)
    with pytest.raises(ValueError, match="part must be one of"):
        distributed.load_rows(client, tmp_path, "holdout")
    with (
        pytest.raises(ValueError, match="workers must be at least 1"),
        distributed.dask_client(workers=0),
    ):
        pass


def test_a_running_scheduler_is_reached_by_its_address(tmp_path: Path) -> None:
    """``scheduler=`` connects to a cluster started elsewhere (here: one worker process)."""
    dataset = make_synthetic(n_users=60, n_items=50, n_interactions=2_000, seed=3)
    write_partitions(dataset, tmp_path, file_rows=1_000, group_rows=500)
    with LocalCluster(
        n_workers=1, threads_per_worker=1, host="127.0.0.1", dashboard_address=None
    ) as cluster:
        with distributed.dask_client(scheduler=cluster.scheduler_address) as client:
            fitted = distributed.fit_ingested(client, tmp_path, seed=SEED, rows=500)
            assert len(client.scheduler_info()["workers"]) == 1
        assert cluster.status.name == "running"  # the client left the cluster running
    expected, _, _ = _in_memory(dataset, SEED)
    _assert_same(expected, fitted)
