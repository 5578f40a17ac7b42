"""What a retrain may learn from the logged streams (issue 30): only events the gateway (or,
for events logged before it recorded trust, the answer log) vouches for train as served;
organic events are capped per user and per item; the gate's holdout says who sent it and
fails when unvouched rows dominate it."""

from __future__ import annotations

import numpy as np
import pandas as pd

from control.retrain.dataset import BASE_SOURCE, combine
from control.retrain.evidence import (
    OrganicCaps,
    bound_organic,
    logged_rows,
    unvouched_check,
    vouched_feedback,
)
from control.validation.config import LoggedEvents
from pipelines.data.schema import RawDataset

COLUMNS = ["stream_id", "user_id", "item_id", "type", "timestamp", "model_version", "request_id"]


def _feedback(rows: list[tuple], trust: list[str] | None = None) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=COLUMNS)
    if trust is not None:
        frame["trust"] = trust
        frame["source"] = "key:aaaa"
    return frame


def _impressions(answers: dict[str, tuple[int, list[int]]]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "stream_id": [f"{n}-0" for n in range(len(answers))],
            "request_id": list(answers),
            "user_id": [user for user, _ in answers.values()],
            "model_version": [1] * len(answers),
            "timestamp": [99] * len(answers),
            "items": [items for _, items in answers.values()],
        }
    )


def test_events_logged_before_trust_levels_are_vouched_for_by_the_answer_log() -> None:
    impressions = _impressions({"a": (5, [10, 11, 12])})
    feedback = _feedback(
        [
            ("1-0", 5, 11, "click", 100, 1, "a"),  # its own answer, a shown item
            ("2-0", 77, 11, "click", 100, 2, "a"),  # another user's answer
            ("3-0", 5, 15, "click", 100, 2, "a"),  # an item the answer did not show
            ("4-0", 5, 11, "click", 100, 2, "f" * 32),  # an answer never logged
            ("5-0", 5, 13, "click", 100, 2, ""),  # no answer named: organic
        ]
    )
    kept, dropped = vouched_feedback(feedback, impressions)
    assert list(kept["trust"]) == ["served", "organic"]
    assert set(kept["source"]) == {"legacy"}
    assert dropped == {
        "untrusted_user_mismatch": 1,
        "untrusted_item_not_shown": 1,
        "untrusted_unknown_request": 1,
    }


def test_the_gateways_trust_level_decides_and_untrusted_events_never_train() -> None:
    feedback = _feedback(
        [
            ("1-0", 5, 11, "click", 100, 1, "a"),
            ("2-0", 5, 12, "click", 101, -1, ""),
            ("3-0", 77, 11, "click", 102, -1, "a"),
        ],
        trust=["served", "organic", "user_mismatch"],
    )
    rows, left_out, _ = logged_rows(feedback, _impressions({"a": (5, [10, 11])}), LoggedEvents())
    assert sorted(zip(rows["item_id"], rows["served"], strict=True)) == [
        (10, True),  # skipped above the click in the served answer: a negative
        (11, True),
        (12, False),
    ]
    assert 77 not in set(rows["user_id"])
    assert left_out == {"untrusted_user_mismatch": 1}


def _organic(users: np.ndarray, items: np.ndarray, start: int = 0) -> pd.DataFrame:
    count = len(users)
    return pd.DataFrame(
        {
            "user_id": users.astype(np.int64),
            "item_id": items.astype(np.int64),
            "rating": np.full(count, 5.0, np.float32),
            "timestamp": np.arange(start, start + count),
            "served": np.zeros(count, bool),
            "trust": "organic",
            "source": "key:attacker",
        }
    )


def test_one_user_or_item_cannot_dominate_the_organic_rows() -> None:
    rng = np.random.default_rng(0)
    genuine = _organic(rng.integers(0, 500, 1000), rng.integers(0, 300, 1000))
    flood = _organic(rng.integers(0, 500, 9000), np.full(9000, 1500), start=1000)
    served = _organic(np.full(50, 3), np.full(50, 1500), start=20_000).assign(
        served=True, trust="served"
    )
    rows = pd.concat([genuine, flood, served], ignore_index=True)
    kept, dropped, notes = bound_organic(rows, OrganicCaps(0.02, 0.02, 20))
    cap = int(0.02 * 10_000)
    item_counts = kept.loc[~kept["served"], "item_id"].value_counts()
    assert item_counts[1500] == cap  # the flooded item: its earliest rows, up to its cap
    assert item_counts.drop(1500).max() <= cap
    assert kept.loc[~kept["served"], "user_id"].value_counts().max() <= cap
    assert kept["served"].sum() == 50  # answers the gateway logged are never capped
    assert dropped["capped_item"] == 9000 - cap
    assert any("item 1500 had 9000 of the 10000 organic rows" in note for note in notes)
    assert kept["timestamp"].is_monotonic_increasing  # the earliest kept, order unchanged


def _raw(rows: int) -> RawDataset:
    users = pd.DataFrame(
        {"user_id": np.arange(600), "age": 30, "gender": "F", "occupation": "x", "zip_code": "1"}
    )
    items = pd.DataFrame({"item_id": np.arange(2000), "title": "t", "year": 1990.0, "genres": "A"})
    rng = np.random.default_rng(1)
    interactions = pd.DataFrame(
        {
            "user_id": rng.integers(0, 600, rows),
            "item_id": rng.integers(0, 300, rows),
            "rating": np.full(rows, 4.0, np.float32),
            "timestamp": np.arange(rows),
        }
    )
    return RawDataset("t", users, items, interactions)


def test_a_flood_of_one_item_from_one_source_does_not_decide_the_holdout() -> None:
    """New events 90% one item from one client: capped, so the holdout stays mostly the
    base data, the check passes and the report says who sent what."""
    rng = np.random.default_rng(2)
    other = rng.integers(0, 300, 100)
    feedback = _feedback(
        [
            (f"{n}-0", int(rng.integers(0, 600)), item, "click", 10_000 + n, -1, "")
            for n, item in enumerate([*other, *[1500] * 900])
        ],
        trust=["organic"] * 1000,
    )
    config = LoggedEvents()
    rows, left_out, notes = logged_rows(feedback, _impressions({}), config)
    assert left_out["capped_item"] == 900 - max(20, int(0.02 * 1000))
    data = combine(_raw(9000), rows)
    check = unvouched_check(data, config)
    assert check.passed and check.value is not None
    assert check.value <= config.max_unvouched_holdout_share
    sources = data.holdout_sources()
    assert sources[BASE_SOURCE] > sources["key:aaaa"] > 0
    assert "key:aaaa" in check.detail and any("item 1500" in note for note in notes)


def test_a_holdout_mostly_unvouched_fails_the_gate_with_the_reason() -> None:
    rng = np.random.default_rng(3)  # many users and items: no cap applies
    feedback = _feedback(
        [
            (
                f"{n}-0",
                int(rng.integers(0, 600)),
                int(rng.integers(0, 2000)),
                "click",
                500 + n,
                -1,
                "",
            )
            for n in range(3000)
        ],
        trust=["organic"] * 3000,
    )
    config = LoggedEvents()
    rows, _, _ = logged_rows(feedback, _impressions({}), config)
    data = combine(_raw(500), rows)
    check = unvouched_check(data, config)
    assert not check.passed and check.name == "holdout.unvouched_share"
    assert check.value is not None and check.value > config.max_unvouched_holdout_share
    assert "no logged answer vouches for" in check.detail and "key:aaaa" in check.detail


def test_imported_events_count_as_the_base_data_does() -> None:
    """What the operator's own tools wrote (a replay): kept, never capped, not unvouched."""
    feedback = _feedback(
        [(f"{n}-0", n % 600, 1500, "click", 10_000 + n, 1, "") for n in range(2000)],
        trust=["imported"] * 2000,
    )
    config = LoggedEvents()
    rows, left_out, notes = logged_rows(feedback, _impressions({}), config)
    assert len(rows) == 2000 and not left_out and not notes  # one item, yet nothing capped
    data = combine(_raw(3000), rows)
    assert data.unvouched_share() == 0.0 and unvouched_check(data, config).passed
