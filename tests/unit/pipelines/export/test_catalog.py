"""Cold-start items and `cascade catalog update` (issue 33): items with features but no
interactions are embedded and indexed; an update adds and changes items as a new version."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cli.main import main
from core.errors import DataError
from core.export.item_index import load_index
from core.export.verify import verify_version
from core.features.schema import Feature
from core.features.workflow import Workflow
from core.ids import IdMap
from pipelines.config import TrainConfig
from pipelines.data.synthetic import make_synthetic
from pipelines.export.catalog import _embed, read_item_table, update_catalog
from services.serving.release import load_release
from tests.conftest import EXPORTED_SIZE


@pytest.fixture
def root(exported: Path, tmp_path: Path) -> Path:
    """A writable copy of the exported root (version 1), without its work directory."""
    copy = tmp_path / "export"
    shutil.copytree(exported, copy, ignore=shutil.ignore_patterns("work"))
    return copy


def _items(root: Path, version: int = 1) -> pd.DataFrame:
    return pd.read_parquet(root / "releases" / str(version) / "online" / "items.parquet")


def _retrieved(root: Path, version: int, item_id: int) -> bool:
    """Whether the ANN index finds ``item_id`` first for the item's own vector."""
    release = root / "releases" / str(version)
    ids = np.load(release / "item_ids.npy")
    vectors = np.load(release / "item_embeddings.npy")
    position = int(np.flatnonzero(ids == item_id)[0])
    _, found = load_index(release / "item_index.faiss").search(vectors[position : position + 1], 1)
    return bool(ids[found[0, 0]] == item_id)


def _snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_cold_start_items_are_embedded_from_their_features_and_indexed(root: Path) -> None:
    raw = make_synthetic(*EXPORTED_SIZE, seed=TrainConfig().seed)
    cold = np.setdiff1d(raw.items["item_id"], raw.interactions["item_id"])
    assert len(cold) > 0  # the fixture's data has items nobody interacted with
    release = root / "releases" / "1"
    ids = np.load(release / "item_ids.npy")
    assert np.isin(cold, ids).all()
    items = _items(root)
    rows = items[items["item_id"].isin(cold)]
    stored = np.load(release / "item_embeddings.npy")[np.flatnonzero(np.isin(ids, cold))]
    embedded = _embed(release, Workflow.load(release / "workflow"), rows)
    np.testing.assert_allclose(embedded, stored, atol=1e-4)  # the item tower, from features
    assert all(_retrieved(root, 1, int(i)) for i in cold)
    manifest = json.loads((release / "manifest.json").read_text())
    assert "releases/1/item_tower.onnx" in manifest["files"]
    assert manifest["item_table"]["key"] == "item_id"


def test_an_update_adds_a_new_sku_and_changes_an_item_as_a_new_version(root: Path) -> None:
    items = _items(root)
    rows = items.iloc[:3][["item_id", "year", "genres"]].copy()
    changed = int(rows["item_id"].iloc[1])
    rows.loc[rows.index[1], "genres"] = "War|Comedy"
    new = pd.DataFrame({"item_id": [10_001], "year": [1999.0], "genres": ["Comedy|Drama"]})
    path = root.parent / "items.csv"
    pd.concat([rows, new]).to_csv(path, index=False)

    outcome = update_catalog(root, path)

    assert (outcome.base, outcome.version) == (1, 2)
    assert (outcome.added, outcome.changed, outcome.unchanged) == (1, 1, 2)
    assert outcome.items == len(items) + 1
    verify_version(root, 2)  # every file matches its manifest
    manifest = json.loads(outcome.manifest.read_text())
    assert manifest["models"] == {"query_tower": 2, "ranker": 2}
    assert manifest["catalog_update"]["base"] == 1
    assert manifest["index"]["items"] == len(items) + 1
    assert (root / "model_repository" / "ranker" / "2" / "gbm.txt").is_file()
    assert _retrieved(root, 2, 10_001)
    merged = _items(root, 2).set_index("item_id")
    assert merged.loc[changed, "genres"] == "War|Comedy"
    assert merged.loc[10_001, "genres"] == "Comedy|Drama"
    before = np.load(root / "releases" / "1" / "item_embeddings.npy")
    after = np.load(root / "releases" / "2" / "item_embeddings.npy")
    differs = np.abs(after[: len(before)] - before).max(axis=1) > 0
    assert np.flatnonzero(differs).tolist() == [1]  # only the changed item was re-embedded
    release = load_release(root, 2)  # what the gateway loads
    assert release.positions(np.array([10_001]))[0] == len(items)
    assert release.popularity[-1] == len(items)  # a new item: no interactions, least popular


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            pd.DataFrame({"item_id": [1], "genres": ["War"]}),
            "column 'year' is missing (columns found: ['item_id', 'genres'])",
        ),
        (
            pd.DataFrame({"item_id": [5, 5], "year": [1990, 1991], "genres": ["War", "War"]}),
            "column 'item_id': a key appears twice with different attributes (row 1:",
        ),
        (
            pd.DataFrame({"item_id": [7], "year": ["long ago"], "genres": ["War"]}),
            "column 'year': numeric feature holds a value that is not a number (1 row in all; "
            "first at row 1: {'item_id': 7, 'year': 'long ago'",
        ),
        (
            pd.DataFrame({"item_id": ["sku-7"], "year": [1990], "genres": ["War"]}),
            "column 'item_id': item ids must be integers here",
        ),
    ],
    ids=["missing-column", "conflicting-duplicate", "wrong-type", "string-key"],
)
def test_a_bad_table_names_file_column_and_row_and_writes_nothing(
    root: Path, table: pd.DataFrame, message: str
) -> None:
    path = root.parent / "items.jsonl"
    table.to_json(path, orient="records", lines=True)
    before = _snapshot(root)
    with pytest.raises(DataError) as error:
        update_catalog(root, path)
    assert str(error.value).startswith(f"{path}: ")
    assert message in str(error.value)
    assert _snapshot(root) == before


def test_string_ids_extend_the_release_map_and_never_renumber(tmp_path: Path) -> None:
    path = tmp_path / "items.parquet"
    pd.DataFrame(
        {"sku": ["b", "new-1", "a"], "brand": ["x", "y", "z"], "available": [True, False, True]}
    ).to_parquet(path)
    features = (Feature("brand", "categorical"), Feature("available", "bool"))
    frame, extended = read_item_table(path, "sku", features, IdMap("str", ["a", "b"]))
    assert frame["item_id"].tolist() == [2, 3, 1]
    assert extended.external.tolist() == ["a", "b", "new-1"]
    assert frame["available"].tolist() == [True, False, True]  # kept as an attribute


def test_the_command_registers_the_new_version_and_fails_cleanly(
    root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CASCADE_REDIS__URL", raising=False)
    path = root.parent / "items.parquet"
    pd.DataFrame({"item_id": [10_002], "year": [2001.0], "genres": ["Drama"]}).to_parquet(path)
    assert main(["catalog", "update", str(path), "--artifacts", str(root)]) == 0
    out = capsys.readouterr().out
    assert "version 2 written from version 1: 1 added, 0 changed, 0 unchanged" in out
    assert "registered candidate" in out and "cascade rollout 2" in out
    registry = json.loads((root / "registry.json").read_text())
    assert json.dumps(registry).count('"catalog_update"') == 1
    desired = json.loads((root / "rollout" / "desired.json").read_text())
    assert desired["production"] == 1  # live only once rolled out / promoted

    pd.DataFrame({"item_id": [1]}).to_parquet(path)
    before = _snapshot(root)
    code = main(["catalog", "update", str(path), "--artifacts", str(root)])
    assert code == 3
    assert "column 'year' is missing" in capsys.readouterr().err
    assert _snapshot(root) == before
