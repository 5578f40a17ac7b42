from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines.data.schema import RawDataset
from pipelines.retrain.dataset import combine, logged_interactions, oldest


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
    rows = logged_interactions(feedback, impressions)
    got = {(int(u), int(i), float(r)) for u, i, r in rows[["user_id", "item_id", "rating"]].values}
    assert got == {(1, 30, 5.0), (2, 60, 5.0), (2, 50, 1.0), (1, 10, 1.0), (1, 20, 1.0)}
    assert rows["timestamp"].is_monotonic_increasing


def test_combine_drops_unknown_ids_and_splits_by_time() -> None:
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
    raw = RawDataset("t", users, items, base)
    logged = pd.DataFrame(
        {
            "user_id": [1, 9, 2, 1],
            "item_id": [3, 1, 7, 2],
            "rating": np.full(4, 5.0, np.float32),
            "timestamp": [100, 101, 102, 103],
        }
    )
    data = combine(raw, logged)
    assert data.logged_rows == 2 and data.dropped == {"unknown_user": 1, "unknown_item": 1}
    holdout = data.holdout()
    assert holdout.rows["timestamp"].min() >= holdout.before["timestamp"].max()
    assert set(holdout.rows["timestamp"]) >= {100, 103}
    assert data.learnt_until() < 100
    assert len(oldest(raw, 0.5).interactions) == 20
    assert oldest(raw, 0.5).interactions["timestamp"].max() == 19
    assert combine(raw, logged).data_hash == data.data_hash != combine(raw, logged[:1]).data_hash
