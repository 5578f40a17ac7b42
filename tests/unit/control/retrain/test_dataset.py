from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from control.retrain.dataset import Learnt, combine, logged_interactions, oldest, oldest_rows
from control.retrain.evidence import vouched_feedback
from pipelines.data.schema import RawDataset


def _feedback(rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame(
        rows,
        columns=[
            "stream_id",
            "user_id",
            "item_id",
            "type",
            "timestamp",
            "model_version",
            "request_id",
        ],
    )


def test_clicks_are_positives_and_skipped_items_negatives() -> None:
    feedback = _feedback(
        [
            ("1-0", 1, 30, "click", 100, 1, "a"),  # rank 2 of answer a
            ("2-0", 1, 30, "click", 100, 1, "a"),  # a duplicate
            ("3-0", 2, 50, "impression", 101, 1, ""),  # shown, never clicked
            ("4-0", 2, 60, "impression", 102, 1, ""),
            ("5-0", 2, 60, "click", 103, 1, ""),  # shown then clicked: no negative
        ]
    )
    impressions = pd.DataFrame(
        {
            "stream_id": ["1-0", "2-0"],
            "request_id": ["a", "b"],
            "user_id": [1, 3],
            "model_version": [1, 1],
            "timestamp": [99, 99],
            "items": [[10, 20, 30, 40], [10, 20]],  # b has no click: no negatives
        }
    )
    rows = logged_interactions(vouched_feedback(feedback, impressions)[0], impressions)
    got = {(int(u), int(i), float(r)) for u, i, r in rows[["user_id", "item_id", "rating"]].values}
    assert got == {(1, 30, 5.0), (2, 60, 5.0), (2, 50, 1.0), (1, 10, 1.0), (1, 20, 1.0)}
    assert rows["timestamp"].is_monotonic_increasing


def test_rows_of_served_answers_are_marked() -> None:
    feedback = _feedback(
        [
            ("1-0", 1, 30, "click", 100, 1, "a"),  # on a logged answer: served
            ("2-0", 2, 40, "click", 101, 1, ""),  # the user's own choice
            ("3-0", 2, 50, "impression", 102, 1, ""),  # shown, not answered: not served
            ("4-0", 3, 60, "click", 103, 1, "gone"),  # its answer is not in the log: untrusted
        ]
    )
    impressions = pd.DataFrame(
        {
            "stream_id": ["1-0"],
            "request_id": ["a"],
            "user_id": [1],
            "model_version": [1],
            "timestamp": [99],
            "items": [[10, 30]],
        }
    )
    kept, dropped = vouched_feedback(feedback, impressions)
    rows = logged_interactions(kept, impressions)
    served = {
        (int(u), int(i)): bool(f) for u, i, f in rows[["user_id", "item_id", "served"]].values
    }
    assert served == {(1, 30): True, (1, 10): True, (2, 40): False, (2, 50): False}
    assert dropped == {"untrusted_unknown_request": 1}


def _raw() -> RawDataset:
    users = pd.DataFrame(
        {
            "user_id": [1, 2],
            "age": [20, 30],
            "gender": ["M", "F"],
            "occupation": ["x", "y"],
            "zip_code": ["1", "2"],
        }
    )
    items = pd.DataFrame(
        {
            "item_id": [1, 2, 3],
            "title": ["a", "b", "c"],
            "year": [1990.0, 1991.0, 1992.0],
            "genres": ["A", "B", "C"],
        }
    )
    base = pd.DataFrame(
        {
            "user_id": [1, 2] * 20,
            "item_id": [1, 2, 3, 1] * 10,
            "rating": np.full(40, 4.0, np.float32),
            "timestamp": np.arange(40),
        }
    )
    return RawDataset("t", users, items, base)


LOGGED = pd.DataFrame(
    {
        "user_id": [1, 9, 2, 1],
        "item_id": [3, 1, 7, 2],
        "rating": np.full(4, 5.0, np.float32),
        "timestamp": [100, 101, 102, 103],
    }
)


def test_combine_drops_unknown_ids_and_splits_by_time() -> None:
    raw, logged = _raw(), LOGGED
    data = combine(raw, logged)
    assert data.logged_rows == 2 and data.dropped == {"unknown_user": 1, "unknown_item": 1}
    holdout = data.holdout()
    assert holdout.rows["timestamp"].min() >= holdout.before["timestamp"].max()
    assert set(holdout.rows["timestamp"]) >= {100, 103}
    assert data.learnt_until() < 100
    assert len(oldest(raw, 0.5).interactions) == 20
    assert oldest(raw, 0.5).interactions["timestamp"].max() == 19
    assert combine(raw, logged).data_hash == data.data_hash != combine(raw, logged[:1]).data_hash


def test_the_holdout_leaves_out_the_base_rows_production_learnt() -> None:
    raw = _raw()
    learnt = np.ones(40, bool)
    learnt[[10, 38]] = False  # production's own held-out rows, one in the newest window
    data = combine(raw, LOGGED, learnt=Learnt(base_rows=learnt, source="its split"))
    held = data.holdout().rows
    assert sorted(held["timestamp"]) == [38, 100, 103]  # window 38, 39, 100, 103 minus learnt
    # what production learnt in the window (39) is the candidate's training data, and so is
    # production's held-out row outside the window (10)
    trained = data.dataset.interactions.iloc[np.r_[data.split.train, data.split.valid]]
    assert {10, 39} <= set(trained["timestamp"])
    note, sources = data.holdout_notes()  # no served rows: nothing said about them
    assert sources == "holdout by source: unknown 2 (67%), base data 1 (33%)"
    assert data.unvouched_share() == pytest.approx(2 / 3)
    assert "newest 4 rows no serving model chose, minus the 1 production learnt from" in note
    assert ": 3 rows, 1 of the base data and 2 logged (what production learnt: its split)" in note
    with pytest.raises(ValueError, match="do not match the base rows"):
        combine(raw, LOGGED, learnt=Learnt(base_rows=learnt[:5]))


def test_a_retrained_production_learnt_every_row_up_to_its_time() -> None:
    data = combine(_raw(), LOGGED, learnt=Learnt(until=100, source="rows up to 100"))
    assert sorted(data.holdout().rows["timestamp"]) == [103]
    assert data.learnt_until() >= 100  # the candidate learnt what production learnt
    assert combine(_raw(), LOGGED).data_hash != data.data_hash  # another holdout, another hash


def test_oldest_rows_are_positions_in_row_order() -> None:
    raw = _raw()
    shuffled = RawDataset(
        "s", raw.users, raw.items, raw.interactions.iloc[::-1].reset_index(drop=True)
    )
    rows = oldest_rows(shuffled, 0.25)
    assert np.all(np.diff(rows) > 0) and sorted(shuffled.interactions["timestamp"][rows]) == list(
        range(10)
    )


def test_rows_of_served_answers_are_held_out_but_not_judged() -> None:
    logged = LOGGED.assign(served=[True, True, False, True])  # (1, 3, 100) and (1, 2, 103)
    data = combine(_raw(), logged)
    held = data.holdout().rows
    assert 103 not in set(held["timestamp"]) and 100 not in set(held["timestamp"])
    trained = data.dataset.interactions.iloc[np.r_[data.split.train, data.split.valid]]
    assert trained["timestamp"].max() < 100  # nothing newer than the window is trained on
    assert data.holdout_notes()[2].startswith("2 rows of served answers")
    assert len(data.split.test) + len(data.split.train) + len(data.split.valid) == 42 - 2
