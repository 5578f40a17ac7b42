from __future__ import annotations

from collections import Counter
from pathlib import Path

from control.retrain.snapshot import parse_entries, read_since, read_snapshots, write_snapshot
from services.stores.memory import InMemoryStore

GOOD = {"user_id": "1", "item_id": "2", "type": "click", "timestamp": "100", "request_id": "r"}


def test_corrupt_entries_are_skipped_and_counted() -> None:
    skipped: Counter = Counter()
    entries = [
        ("1-0", GOOD),
        ("2-0", {**GOOD, "user_id": "x"}),
        ("3-0", {"item_id": "2", "type": "click"}),
        ("4-0", {**GOOD, "type": "purchase"}),
        ("5-0", {**GOOD, "timestamp": "nan"}),
        ("6-0", {**GOOD, "item_id": "-3"}),
        ("7-0", "not a mapping"),  # type: ignore[list-item]
        ("8000-0", {k: v for k, v in GOOD.items() if k != "timestamp"}),
    ]
    rows = parse_entries("feedback", entries, skipped)  # type: ignore[arg-type]
    assert [r["stream_id"] for r in rows] == ["1-0", "8000-0"]
    assert rows[1]["timestamp"] == 8  # from the stream id's milliseconds
    assert skipped == Counter(
        {
            "feedback:bad_user_id": 1,
            "feedback:missing_user_id": 1,
            "feedback:bad_type": 1,
            "feedback:bad_timestamp": 1,
            "feedback:bad_item_id": 1,
            "feedback:not_a_mapping": 1,
        }
    )
    impressions = parse_entries(
        "impressions",
        [
            ("1-0", {"request_id": "r", "user_id": "1", "items": "3 4 5", "timestamp": "9"}),
            ("2-0", {"request_id": "r", "user_id": "1", "items": "3 x"}),
            ("3-0", {"request_id": "r", "user_id": "1", "items": ""}),
            ("4-0", {"user_id": "1", "items": "3"}),
        ],
        skipped,
    )
    assert [r["items"] for r in impressions] == [[3, 4, 5]]
    assert skipped["impressions:bad_items"] == 2 and skipped["impressions:missing_request_id"] == 1


async def test_reads_pages_after_the_cursor_and_round_trips(tmp_path: Path) -> None:
    store = InMemoryStore()
    await store.start()
    await store.append_feedback(
        [{**GOOD, "item_id": str(i)} for i in range(25)], max_len=1000, idempotency_ttl_s=60
    )
    await store.append_impressions(
        [
            {
                "request_id": "r",
                "user_id": "1",
                "model_version": "1",
                "items": "1 2",
                "scores": "1 0",
                "degraded": "0",
                "timestamp": "5",
            }
        ],
        max_len=1000,
        ttl_s=60,
    )
    first = await read_since(store, {"feedback": "0-0", "impressions": "0-0"}, page=10)
    assert len(first.feedback) == 25 and len(first.impressions) == 1
    assert first.feedback["item_id"].tolist() == list(range(25))
    again = await read_since(store, first.cursor, page=10)
    assert again.entries == 0 and again.cursor == first.cursor
    await store.append_feedback([{**GOOD, "item_id": "99"}], 1000, 60)
    later = await read_since(store, first.cursor)
    assert later.feedback["item_id"].tolist() == [99]

    paths = {"feedback": tmp_path / "a-feedback.parquet", "impressions": tmp_path / "a-i.parquet"}
    write_snapshot(first, paths)
    assert read_snapshots([paths["feedback"]], "feedback")["item_id"].tolist() == list(range(25))
    assert read_snapshots([paths["impressions"]], "impressions")["items"].map(list).tolist() == [
        [1, 2]
    ]
    assert len(read_snapshots([tmp_path / "missing.parquet"], "feedback")) == 0
    assert not list(tmp_path.glob(".*.tmp"))
