"""The shop sample the project ships (examples/shop): it parses, ingests with string ids and
cold-start items, and make_sample.py rewrites its files byte for byte."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from core.ids import MAX_ID_LENGTH
from pipelines.data.dataset_file import load_dataset_file
from pipelines.data.ingest import ingest, load_ingested

SHOP = Path(__file__).resolve().parents[4] / "examples" / "shop"
DATA_FILES = ("events.jsonl.gz", "items.csv", "users.csv")


def _make_sample() -> ModuleType:
    spec = importlib.util.spec_from_file_location("shop_make_sample", SHOP / "make_sample.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ingested(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    output = tmp_path_factory.mktemp("shop") / "data"
    return ingest(load_dataset_file(SHOP / "dataset.yaml"), output), output


def test_the_dataset_file_declares_every_kind_of_feature() -> None:
    dataset = load_dataset_file(SHOP / "dataset.yaml")
    schema = dataset.feature_schema()
    kinds = {f.name: f.kind for f in (*schema.user, *schema.item)}
    assert kinds == {
        "country": "categorical",
        "age": "numeric",
        "segments": "multi_categorical",
        "brand": "categorical",
        "tags": "multi_categorical",
        "price": "numeric",
        "available": "bool",
    }
    assert dataset.spec.interactions.event is not None
    assert dataset.spec.interactions.event.positive == ["click", "add_to_cart", "purchase"]


def test_it_ingests_with_string_ids_and_both_outcomes(ingested: tuple[dict, Path]) -> None:
    summary, _ = ingested
    assert summary["id_kinds"] == {"user": "str", "item": "str"}
    assert summary["users"] == 1_500 and summary["items"] == 760
    assert 40_000 <= summary["rows"] <= 80_000
    assert summary["ratings"]["5"] > 0 and summary["ratings"]["1"] > 0  # positives and views
    assert summary["users_without_attributes"] == 0 == summary["items_without_attributes"]


def test_it_has_cold_start_items(ingested: tuple[dict, Path]) -> None:
    summary, output = ingested
    raw = load_ingested(output)
    with_events = set(raw.interactions["item_id"])
    cold = [i for i in raw.items["item_id"] if i not in with_events]
    assert summary["items_only_in_table"] == len(cold) == 40
    skus = raw.item_ids.external[[i - 1 for i in cold]]  # internal id i is row i - 1
    assert all(str(sku).startswith("SKU-") for sku in skus)
    assert raw.items.set_index("item_id").loc[cold, "brand"].notna().all()


def test_its_ids_are_strings_some_unicode_some_long(ingested: tuple[dict, Path]) -> None:
    raw = load_ingested(ingested[1])
    skus = [str(s) for s in raw.item_ids.external]
    customers = [str(c) for c in raw.user_ids.external]
    assert raw.user_ids.kind == raw.item_ids.kind == "str"
    assert any(not s.isascii() for s in skus)
    assert 150 < max(map(len, skus)) <= MAX_ID_LENGTH
    assert max(map(len, customers)) > 50
    assert raw.items["price"].notna().all()


def test_events_are_json_lines_with_millisecond_times() -> None:
    first = json.loads(gzip.decompress((SHOP / "events.jsonl.gz").read_bytes()).split(b"\n")[0])
    assert set(first) >= {"customer", "sku", "action", "ts"}
    assert first["ts"] > 10**12  # milliseconds


def test_make_sample_rewrites_the_committed_files(tmp_path: Path) -> None:
    written = _make_sample().write(tmp_path)
    assert sorted(p.name for p in written) == sorted(DATA_FILES)
    for name in DATA_FILES:
        assert (tmp_path / name).read_bytes() == (SHOP / name).read_bytes(), name


def test_the_sample_stays_small() -> None:
    assert sum((SHOP / name).stat().st_size for name in DATA_FILES) < 1_500_000
