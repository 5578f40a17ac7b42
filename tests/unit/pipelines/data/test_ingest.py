"""Ingest: each format and path form, ids, timestamps, the positive rules, features, and every
check's error (file, column, first bad row); a failed run leaves nothing behind."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.errors import DataError
from core.ids import MAX_ID_LENGTH
from pipelines.data.dataset_file import load_dataset_file
from pipelines.data.ingest import ingest, load_ingested
from pipelines.data.schema import RawDataset
from pipelines.data.string_ids import StringIds

EVENTS = [
    {"customer_id": "u1", "sku": "A-1", "ts": 1_700_000_000, "action": "click"},
    {"customer_id": "u2", "sku": "B-2", "ts": 1_700_000_100, "action": "view"},
    {"customer_id": "u1", "sku": "B-2", "ts": 1_700_000_200, "action": "purchase"},
]
EVENT_RULE = "  event: {column: action, positive: [purchase, click], weight: {purchase: 3.0}}\n"


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    """``rows`` in the format ``path``'s name says."""
    path.parent.mkdir(parents=True, exist_ok=True)
    name = path.name
    if name.endswith(".parquet"):
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif ".jsonl" in name:
        text = "".join(json.dumps(row) + "\n" for row in rows).encode()
        path.write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
    else:
        columns = list(rows[0])
        lines = [",".join(columns)] + [
            ",".join("" if r[c] is None else str(r[c]) for c in columns) for r in rows
        ]
        text = ("\n".join(lines) + "\n").encode()
        path.write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
    return path


def dataset_file(tmp_path: Path, path: str, rule: str = EVENT_RULE, extra: str = "") -> Path:
    text = (
        f"interactions:\n  path: {path}\n  user: customer_id\n  item: sku\n  timestamp: ts\n"
        + rule
        + extra
    )
    file = tmp_path / "dataset.yaml"
    file.write_text(text)
    return file


def run(tmp_path: Path, path: str = "e.parquet", **kwargs: str) -> RawDataset:
    ingest(load_dataset_file(dataset_file(tmp_path, path, **kwargs)), tmp_path / "out")
    return load_ingested(tmp_path / "out")


def failure(tmp_path: Path, path: str = "e.parquet", **kwargs: str) -> str:
    """The error of an ingest that must fail, after checking it left no output behind."""
    with pytest.raises(DataError) as error:
        ingest(load_dataset_file(dataset_file(tmp_path, path, **kwargs)), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]
    return str(error.value)


# --- formats, paths, ids --------------------------------------------------------------------
@pytest.mark.parametrize("name", ["e.parquet", "e.csv", "e.csv.gz", "e.jsonl", "e.jsonl.gz"])
def test_each_format_gives_the_same_data_set(tmp_path: Path, name: str) -> None:
    write_rows(tmp_path / name, EVENTS)
    data = run(tmp_path, name)
    frame = data.interactions
    assert frame["user_id"].tolist() == [1, 2, 1]
    assert frame["item_id"].tolist() == [1, 2, 2]
    assert frame["rating"].tolist() == [5.0, 1.0, 5.0]
    assert frame["weight"].tolist() == [1.0, 1.0, 3.0]
    assert frame["timestamp"].tolist() == [1_700_000_000, 1_700_000_100, 1_700_000_200]
    assert str(frame["user_id"].dtype) == "int64" and str(frame["rating"].dtype) == "float32"
    assert data.user_ids.to_external([1, 2]) == ["u1", "u2"]
    assert data.item_ids.to_internal(["B-2", "nope"]).tolist() == [2, 0]
    summary = json.loads((tmp_path / "out" / "ingest.json").read_text())
    assert summary["rows"] == 3 and summary["ratings"] == {"5": 2, "3": 0, "1": 1}
    assert summary["files"][0]["bytes"] > 0 and summary["files"][0]["rows"] == 3


@pytest.mark.parametrize("path", ["logs", "logs/**/*.csv"])
def test_directories_and_globs_read_files_in_path_order(tmp_path: Path, path: str) -> None:
    write_rows(tmp_path / "logs" / "b" / "2.csv", EVENTS[2:])
    write_rows(tmp_path / "logs" / "a" / "1.csv", EVENTS[:2])
    (tmp_path / "logs" / "notes.txt").write_text("not data")
    data = run(tmp_path, path)
    assert data.interactions["timestamp"].tolist() == [e["ts"] for e in EVENTS]
    summary = json.loads((tmp_path / "out" / "ingest.json").read_text())
    assert [Path(f["path"]).name for f in summary["files"]] == ["1.csv", "2.csv"]


@pytest.mark.parametrize("name", ["e.parquet", "e.csv", "e.jsonl"])
def test_integer_ids_stay_themselves(tmp_path: Path, name: str) -> None:
    rows = [{**e, "customer_id": 10 + i, "sku": 700 + i} for i, e in enumerate(EVENTS)]
    data = run(tmp_path / "x", write_rows(tmp_path / "x" / name, rows).name)
    assert data.interactions["user_id"].tolist() == [10, 11, 12]
    assert data.interactions["item_id"].tolist() == [700, 701, 702]
    assert data.user_ids.kind == "int" and data.item_ids.kind == "int"
    assert not (tmp_path / "x" / "out" / "user_ids.parquet").exists()
    assert data.users["user_id"].tolist() == [10, 11, 12]


def test_csv_ids_with_leading_zeros_or_letters_later_are_strings(tmp_path: Path) -> None:
    write_rows(tmp_path / "logs" / "1.csv", [{**EVENTS[0], "customer_id": "7", "sku": "0042"}])
    write_rows(tmp_path / "logs" / "2.csv", [{**EVENTS[2], "customer_id": "x9", "sku": "42"}])
    data = run(tmp_path, "logs")
    assert data.user_ids.kind == "str" and data.user_ids.to_external([1, 2]) == ["7", "x9"]
    assert data.item_ids.to_external([1, 2]) == ["0042", "42"]


def test_progress_lines_name_the_rows_the_file_and_the_restart(tmp_path: Path) -> None:
    write_rows(tmp_path / "logs" / "1.csv", [{**EVENTS[0], "customer_id": "7", "sku": "5"}])
    write_rows(tmp_path / "logs" / "2.csv", [{**EVENTS[2], "customer_id": "x9", "sku": "6"}])
    lines: list[str] = []
    ingest(load_dataset_file(dataset_file(tmp_path, "logs")), tmp_path / "out", lines.append, 0.0)
    # the integer guess holds for the first file; "x9" in the second breaks it for the users
    shown = [re.sub(r", [\d,]+ rows/s;", ", N rows/s;", line) for line in lines[:4]]
    assert shown == [
        "ingest: 1 rows read, N rows/s; file 1 of 2 (1.csv); converting",
        "ingest: user ids are not all integers: reading again as strings",
        "ingest: 1 rows read, N rows/s; file 1 of 2 (1.csv); converting",
        "ingest: 2 rows read, N rows/s; file 2 of 2 (2.csv); converting",
    ]
    assert re.fullmatch(
        r"ingest: 2 interactions from 2 files in [\d.]+ s \([\d,]+ rows/s\): 2 users, 2 items",
        lines[4],
    )
    assert len(lines) == 5


def test_progress_lines_wait_their_interval_and_say_when_only_checking(tmp_path: Path) -> None:
    write_rows(tmp_path / "logs" / "1.csv", [{**EVENTS[0], "ts": "not a time"}])
    write_rows(tmp_path / "logs" / "2.csv", [EVENTS[1]])
    dataset = load_dataset_file(dataset_file(tmp_path, "logs"))
    lines: list[str] = []
    with pytest.raises(DataError, match="timestamp"):
        ingest(dataset, tmp_path / "out", lines.append, 0.0)
    rows = [line for line in lines if " rows read" in line]
    assert [line.rsplit("; ", 1)[1] for line in rows] == [
        "checking only (a problem was found)",
        "checking only (a problem was found)",
    ]
    quiet: list[str] = []  # an hour between lines: none while reading, none at a failure
    with pytest.raises(DataError, match="timestamp"):
        ingest(dataset, tmp_path / "out", quiet.append, 3600.0)
    assert not [line for line in quiet if " rows read" in line]


def test_unicode_ids_round_trip(tmp_path: Path) -> None:
    rows = [{**e, "customer_id": name} for e, name in zip(EVENTS, ["ü", "用户", "ü"], strict=True)]
    data = run(tmp_path, write_rows(tmp_path / "e.jsonl", rows).name)
    assert data.interactions["user_id"].tolist() == [1, 2, 1]
    assert data.user_ids.to_external([1, 2]) == ["ü", "用户"]


def test_string_ids_are_numbered_in_first_seen_order_across_batches() -> None:
    table = StringIds()
    first = table.ids(pa.array(["b", "a", "", "long" * 40]))
    again = table.ids(pa.array(["a", "new", "b"]))
    assert first.tolist() == [1, 2, 3, 4] and again.tolist() == [2, 5, 1]
    assert table.words() == ["b", "a", "", "long" * 40, "new"]
    many = pa.array([f"id{i}" for i in range(20_000)])  # grows the table several times
    ids = table.ids(many)
    assert len(set(ids.tolist())) == 20_000 and (table.ids(many) == ids).all()


# --- timestamps and the positive rules ------------------------------------------------------
def test_timestamps_in_seconds_milliseconds_and_iso_8601(tmp_path: Path) -> None:
    stamps = [1_700_000_000, 1_700_000_000_123, "2023-11-14T22:13:20Z"]
    rows = [{**e, "ts": t} for e, t in zip(EVENTS, stamps, strict=True)]
    data = run(tmp_path, write_rows(tmp_path / "e.csv", rows).name)
    assert data.interactions["timestamp"].tolist() == [1_700_000_000] * 3


def test_iso_timestamps_with_offsets_and_a_declared_pattern(tmp_path: Path) -> None:
    stamps = ["2023-11-14T23:13:20+01:00", "2023-11-14 22:13:20", "2023-11-14T22:13:20.5Z"]
    rows = [{**e, "ts": t} for e, t in zip(EVENTS, stamps, strict=True)]
    data = run(tmp_path / "iso", write_rows(tmp_path / "iso" / "e.parquet", rows).name)
    assert data.interactions["timestamp"].tolist() == [1_700_000_000] * 3
    rows = [{**e, "ts": "14/11/2023 22:13"} for e in EVENTS]
    write_rows(tmp_path / "fmt" / "e.parquet", rows)
    extra = "  timestamp_format: '%d/%m/%Y %H:%M'\n"
    data = run(tmp_path / "fmt", "e.parquet", extra=extra)
    assert data.interactions["timestamp"].tolist() == [1_699_999_980] * 3


def test_declared_unit_overrides_the_guess(tmp_path: Path) -> None:
    rows = [{**e, "ts": 5_000} for e in EVENTS]
    write_rows(tmp_path / "e.parquet", rows)
    data = run(tmp_path, extra="  timestamp_format: ms\n")
    assert data.interactions["timestamp"].tolist() == [5, 5, 5]


def test_retrieval_only_events_and_no_weights(tmp_path: Path) -> None:
    write_rows(tmp_path / "e.parquet", EVENTS)
    rule = "  event: {column: action, positive: [purchase], retrieval_only: [click]}\n"
    data = run(tmp_path, rule=rule)
    assert data.interactions["rating"].tolist() == [3.0, 1.0, 5.0]
    assert "weight" not in data.interactions


def test_rating_rule_with_neutral_at(tmp_path: Path) -> None:
    rows = [{**e, "action": None, "stars": s} for e, s in zip(EVENTS, [5, 3.5, 1], strict=True)]
    write_rows(tmp_path / "e.parquet", rows)
    rule = "  rating: {column: stars, positive_at: 4, neutral_at: 3}\n"
    assert run(tmp_path, rule=rule).interactions["rating"].tolist() == [5.0, 3.0, 1.0]


# --- user and item tables -------------------------------------------------------------------
ITEMS = """\
items:
  path: items.{ext}
  key: sku
  features:
    brand: categorical
    tags: {{kind: multi_categorical, separator: ";"}}
    price: numeric
    available: bool
"""


@pytest.mark.parametrize("ext", ["parquet", "csv"])
def test_item_table_features_and_cold_start_items(tmp_path: Path, ext: str) -> None:
    write_rows(tmp_path / "e.parquet", EVENTS)
    tags: list[Any] = [["red", "x|y"], [], ["blue"]]
    if ext == "csv":
        tags = ["red;x|y", "", " blue ;"]
    items = [
        {"sku": "B-2", "brand": "acme", "tags": tags[0], "price": 2.5, "available": True},
        {"sku": "B-2", "brand": "acme", "tags": tags[0], "price": 2.5, "available": True},
        {"sku": "C-3", "brand": "0042", "tags": tags[1], "price": 1, "available": False},
        {"sku": "D-4", "brand": None, "tags": tags[2], "price": None, "available": None},
    ]
    write_rows(tmp_path / f"items.{ext}", items)
    data = run(tmp_path, "e.parquet", extra=ITEMS.format(ext=ext))
    assert data.item_ids.to_external([1, 2, 3, 4]) == ["B-2", "C-3", "D-4", "A-1"]
    frame = data.items.set_index("item_id")
    assert frame["brand"].tolist()[:2] == ["acme", "0042"] and frame["brand"][2:].isna().all()
    assert frame["tags"].tolist() == ["red;x|y", "", "blue", ""]
    tags_feature = next(f for f in data.schema.item if f.name == "tags")
    assert tags_feature.separator == ";"  # "|" occurs in a value
    assert frame["price"].tolist()[:2] == [2.5, 1.0] and np.isnan(frame["price"].iloc[2])
    assert frame["available"].tolist()[:2] == [True, False]
    assert data.interactions["item_id"].tolist() == [4, 1, 1]
    summary = json.loads((tmp_path / "out" / "ingest.json").read_text())
    assert summary["items_only_in_table"] == 2 and summary["items_without_attributes"] == 1
    assert summary["users"] == 2 and list(data.users.columns) == ["user_id"]


def test_user_table_with_string_bools_and_list_segments(tmp_path: Path) -> None:
    write_rows(tmp_path / "e.parquet", EVENTS)
    users = [{"customer_id": "u2", "vip": "Yes", "segments": ["a", "b"]}]
    write_rows(tmp_path / "users.parquet", users)
    extra = (
        "users:\n  path: users.parquet\n  key: customer_id\n"
        "  features: {vip: bool, segments: multi_categorical}\n"
    )
    data = run(tmp_path, extra=extra)
    assert data.user_ids.to_external([1, 2]) == ["u2", "u1"]
    assert data.users["vip"].tolist() == [True, None]
    assert data.users["segments"].tolist() == ["a|b", ""]


# --- the checks -----------------------------------------------------------------------------
def test_missing_column_lists_the_columns_found(tmp_path: Path) -> None:
    rows = [{k: v for k, v in e.items() if k != "ts"} for e in EVENTS]
    write_rows(tmp_path / "e.csv", rows)
    message = failure(tmp_path, "e.csv")
    assert "e.csv: column 'ts' is missing" in message
    assert "['customer_id', 'sku', 'action']" in message


@pytest.mark.parametrize("name", ["e.parquet", "e.csv"])
def test_null_and_empty_ids_are_counted_with_an_example_row(tmp_path: Path, name: str) -> None:
    rows = [*EVENTS, {**EVENTS[0], "customer_id": None}, {**EVENTS[1], "customer_id": " "}]
    write_rows(tmp_path / name, rows)
    message = failure(tmp_path, name)
    assert f"{name}: column 'customer_id': user id is null or empty (2 rows in all;" in message
    assert "first at row 4: {'customer_id': None, 'sku': 'A-1'" in message


def test_null_integer_ids_and_ids_below_one(tmp_path: Path) -> None:
    rows = [{**e, "sku": i} for i, e in enumerate(EVENTS)]
    write_rows(tmp_path / "e.jsonl", rows)
    message = failure(tmp_path, "e.jsonl")
    assert "column 'sku': item id is not >= 1 (0 means unknown) (1 row in all;" in message
    assert "row 1: {'customer_id': 'u1', 'sku': 0" in message
    rows = [{**e, "sku": None if i == 2 else i + 1} for i, e in enumerate(EVENTS)]
    write_rows(tmp_path / "e.parquet", rows)
    assert "column 'sku': item id is null (1 row in all; first at row 3" in failure(tmp_path)


def test_an_id_longer_than_the_limit(tmp_path: Path) -> None:
    rows = [*EVENTS, {**EVENTS[0], "sku": "x" * (MAX_ID_LENGTH + 1)}]
    write_rows(tmp_path / "e.parquet", rows)
    message = failure(tmp_path)
    assert f"column 'sku': item id is longer than {MAX_ID_LENGTH} characters" in message
    assert "first at row 4:" in message


def test_unparseable_timestamps(tmp_path: Path) -> None:
    rows = [*EVENTS, {**EVENTS[0], "ts": "yesterday"}, {**EVENTS[0], "ts": None}]
    write_rows(tmp_path / "e.jsonl", [{**r, "ts": str(r["ts"])} for r in rows[:3]] + rows[3:])
    message = failure(tmp_path, "e.jsonl")
    assert "e.jsonl: column 'ts': timestamp is null or cannot be read (2 rows in all;" in message
    assert "first at row 4: {'customer_id': 'u1', 'sku': 'A-1', 'ts': 'yesterday'" in message


def test_no_positive_row_lists_the_values_found(tmp_path: Path) -> None:
    write_rows(tmp_path / "e.parquet", [{**e, "action": "view"} for e in EVENTS])
    message = failure(tmp_path)
    assert "column 'action': no positive row: no row holds one of ['purchase', 'click']" in message
    assert "(values found: ['view'])" in message
    rows = [{**e, "stars": 2} for e in EVENTS]
    write_rows(tmp_path / "e.parquet", rows)
    rule = "  rating: {column: stars, positive_at: 4}\n"
    assert "no rating is >= 4 (values found: [2.0])" in failure(tmp_path, rule=rule)


def test_ratings_that_are_not_numbers(tmp_path: Path) -> None:
    rows = [{**e, "stars": s} for e, s in zip(EVENTS, ["5", "four", "1"], strict=True)]
    write_rows(tmp_path / "e.parquet", rows)
    message = failure(tmp_path, rule="  rating: {column: stars, positive_at: 4}\n")
    assert "column 'stars': rating is null or not a number (1 row in all; first at row 2" in message


def test_conflicting_duplicate_keys_in_a_table(tmp_path: Path) -> None:
    write_rows(tmp_path / "e.parquet", EVENTS)
    items = [
        {"sku": "A-1", "brand": "acme", "tags": "", "price": 1, "available": True},
        {"sku": "A-1", "brand": "other", "tags": "", "price": 1, "available": True},
    ]
    write_rows(tmp_path / "items.csv", items)
    message = failure(tmp_path, extra=ITEMS.format(ext="csv"))
    assert "items.csv: column 'sku': a key appears twice with different attributes" in message
    assert "row 1: {'sku': 'A-1', 'brand': 'acme'" in message
    assert "row 2: {'sku': 'A-1', 'brand': 'other'" in message


@pytest.mark.parametrize(
    ("column", "values", "expected"),
    [
        ("price", ["1", "cheap"], "column 'price': numeric feature holds a value that is not a"),
        ("available", ["true", "maybe"], "column 'available': bool feature holds a value that"),
        ("brand", [None, ["a", "b"]], "column 'brand': categorical feature holds list"),
    ],
)
def test_feature_columns_of_the_wrong_type(
    tmp_path: Path, column: str, values: list[Any], expected: str
) -> None:
    write_rows(tmp_path / "e.parquet", EVENTS)
    good: dict[str, Any] = {"sku": "A-1", "brand": "acme", "tags": "t", "price": 1}
    good["available"] = "true"
    rows = [{**good, column: values[0]}, {**good, "sku": "B-2", column: values[1]}]
    write_rows(tmp_path / "items.parquet", rows)
    message = failure(tmp_path, extra=ITEMS.format(ext="parquet"))
    assert f"items.parquet: {expected}" in message
    assert "(1 row in all; first at row 2: {'sku': 'B-2'" in message


def test_delimited_text_needs_a_separator(tmp_path: Path) -> None:
    write_rows(tmp_path / "e.parquet", EVENTS)
    write_rows(tmp_path / "items.csv", [{"sku": "A-1", "tags": "a|b"}])
    extra = "items: {path: items.csv, key: sku, features: {tags: multi_categorical}}\n"
    message = failure(tmp_path, extra=extra)
    assert "column 'tags': multi_categorical feature holds text: give its `separator:`" in message


def test_no_files_found(tmp_path: Path) -> None:
    assert "no data files found" in failure(tmp_path, "logs/*.parquet")


def test_a_failed_run_keeps_the_previous_output(tmp_path: Path) -> None:
    write_rows(tmp_path / "e.parquet", EVENTS)
    run(tmp_path)
    write_rows(tmp_path / "e.parquet", [{**e, "action": "view"} for e in EVENTS])
    with pytest.raises(DataError):
        ingest(load_dataset_file(tmp_path / "dataset.yaml"), tmp_path / "out")
    assert load_ingested(tmp_path / "out").interactions["rating"].tolist() == [5.0, 1.0, 5.0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset.yaml", "e.parquet", "out"]


def test_output_layout(tmp_path: Path) -> None:
    write_rows(tmp_path / "e.parquet", EVENTS)
    run(tmp_path)
    out = tmp_path / "out"
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "ingest.json",
        "interactions",
        "item_ids.parquet",
        "items.parquet",
        "schema.json",
        "user_ids.parquet",
        "users.parquet",
    ]
    assert [p.name for p in (out / "interactions").iterdir()] == ["part-00000.parquet"]


def test_user_problems_come_first_though_the_sides_map_in_two_threads(tmp_path: Path) -> None:
    rows = [{**EVENTS[0], "sku": ""}, *EVENTS, {**EVENTS[1], "customer_id": ""}]
    write_rows(tmp_path / "e.parquet", rows)
    message = failure(tmp_path)
    assert "column 'customer_id': user id is null or empty (1 row in all; first at row 5" in message
    rows = [*EVENTS, {**EVENTS[1], "sku": "y" * (MAX_ID_LENGTH + 1)}, {**EVENTS[0], "sku": " "}]
    write_rows(tmp_path / "e.parquet", rows)
    message = failure(tmp_path)  # the first kind of problem met in the batch: the empty one
    assert "column 'sku': item id is null or empty (1 row in all; first at row 5" in message
