"""The gate's holdout: the most recent window of interactions, and what the gate derives
from it (the users and positives of retrieval, the ranking rows, the declared slices).

Everything here is raw ids, so a candidate and a production version with different fitted
workflows and catalogs are scored on exactly the same users, items and rows.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from control.validation.config import GateConfig
from core.features.spec import LIKED_RATING
from pipelines.split import POSITIVE_RATING

SLICES = ("new_users", "heavy_users", "long_tail_items")


@dataclass(frozen=True)
class Holdout:
    """Raw tables: the catalog, the interactions before the holdout window, and the window."""

    users: pd.DataFrame
    items: pd.DataFrame
    before: pd.DataFrame
    rows: pd.DataFrame

    def content_hash(self) -> str:
        """A short hash of the holdout rows (recorded in the verdict)."""
        digest = hashlib.sha256()
        for column in ("user_id", "item_id", "rating", "timestamp"):
            digest.update(np.ascontiguousarray(self.rows[column].to_numpy()).tobytes())
        return digest.hexdigest()[:16]


def _by_user(frame: pd.DataFrame) -> dict[int, np.ndarray]:
    """user id -> item ids in time order."""
    ordered = frame.sort_values(["user_id", "timestamp"], kind="stable")
    users, items = ordered["user_id"].to_numpy(), ordered["item_id"].to_numpy()
    bounds = np.flatnonzero(np.diff(users)) + 1
    starts = np.r_[0, bounds] if len(users) else np.zeros(0, int)
    return (
        dict(zip(users[starts].tolist(), np.split(items, bounds), strict=True))
        if len(users)
        else {}
    )


@dataclass
class EvalSet:
    """What both versions are scored on.

    Retrieval: ``users`` (raw ids) each with at least one *new* positive in the window
    (rating >= 3, an item the user had no interaction with before), ``truth`` per user,
    ``seen`` (every item of the user before the window: excluded from the ranking, as
    serving filters them), ``history`` (positives before the window, oldest first).
    Ranking: ``rank_rows`` (user_id, item_id, timestamp, label; rating == 3 dropped).
    Slices: boolean masks over ``users`` and over ``rank_rows``; ``tail_truth`` is each
    user's new positives on long-tail items.
    """

    users: np.ndarray
    truth: list[np.ndarray]
    seen: list[np.ndarray]
    history: list[np.ndarray]
    rank_rows: pd.DataFrame
    user_slices: dict[str, np.ndarray] = field(default_factory=dict)
    row_slices: dict[str, np.ndarray] = field(default_factory=dict)
    tail_truth: list[np.ndarray] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def build_eval_set(holdout: Holdout, config: GateConfig, seed: int = 0) -> EvalSet:
    """Derive users, positives, ranking rows and slices from the holdout (seeded samples)."""
    rng = np.random.default_rng(seed)
    before, rows = holdout.before, holdout.rows
    seen_by_user = _by_user(before)
    liked_before = _by_user(before[before["rating"] >= POSITIVE_RATING])
    positives = rows[rows["rating"] >= POSITIVE_RATING].drop_duplicates(["user_id", "item_id"])
    empty = np.zeros(0, np.int64)
    earlier = before[["user_id", "item_id"]].drop_duplicates()
    matched = positives.merge(earlier, on=["user_id", "item_id"], how="left", indicator=True)
    positives = positives[(matched["_merge"] == "left_only").to_numpy()]
    truth_by_user = _by_user(positives)
    users = np.asarray(sorted(truth_by_user), dtype=np.int64)
    notes = []
    if len(users) > config.holdout.max_users:
        notes.append(
            f"retrieval on a seeded sample of {config.holdout.max_users} of {len(users)} users"
        )
        users = np.sort(rng.choice(users, config.holdout.max_users, replace=False))

    # slices, cut from the data before the window
    activity = before.groupby("user_id").size()
    heavy_cut = (
        float(np.quantile(activity.to_numpy(), 1 - config.slice_definitions.heavy_user_fraction))
        if len(activity)
        else np.inf
    )
    heavy_users = set(activity[activity >= heavy_cut].index.tolist())
    counts = before.groupby("item_id").size().sort_values(ascending=False, kind="stable")
    n_head = int(np.ceil(config.slice_definitions.head_item_fraction * len(holdout.items)))
    head = set(counts.index[:n_head].tolist())

    user_list = users.tolist()
    truth = [truth_by_user[u] for u in user_list]
    head_ids = np.asarray(sorted(head), dtype=np.int64)
    tail_truth = [t[~np.isin(t, head_ids)] for t in truth]
    user_slices = {
        "new_users": np.asarray([u not in seen_by_user for u in user_list], bool),
        "heavy_users": np.asarray([u in heavy_users for u in user_list], bool),
        "long_tail_items": np.asarray([len(t) > 0 for t in tail_truth], bool),
    }

    rank_rows = rows[rows["rating"] != POSITIVE_RATING][["user_id", "item_id", "timestamp"]].copy()
    rank_rows["label"] = (rows.loc[rank_rows.index, "rating"] >= LIKED_RATING).astype(np.float32)
    if len(rank_rows) > config.holdout.max_rows:
        notes.append(
            f"ranking on a seeded sample of {config.holdout.max_rows} of {len(rank_rows)} rows"
        )
        rank_rows = rank_rows.iloc[
            np.sort(rng.choice(len(rank_rows), config.holdout.max_rows, replace=False))
        ]
    rank_rows = rank_rows.reset_index(drop=True)
    row_users = rank_rows["user_id"].to_numpy()
    row_slices = {
        "new_users": ~np.isin(row_users, np.asarray(list(seen_by_user), dtype=np.int64)),
        "heavy_users": np.isin(row_users, np.asarray(list(heavy_users), dtype=np.int64)),
        "long_tail_items": ~np.isin(rank_rows["item_id"].to_numpy(), head_ids),
    }
    return EvalSet(
        users=users,
        truth=truth,
        seen=[seen_by_user.get(u, empty) for u in user_list],
        history=[liked_before.get(u, empty) for u in user_list],
        rank_rows=rank_rows,
        user_slices=user_slices,
        row_slices=row_slices,
        tail_truth=tail_truth,
        notes=notes,
    )
