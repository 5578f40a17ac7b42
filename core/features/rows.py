"""Assemble raw feature rows (interaction x user attributes x item attributes).

Offline, rows come from logged interactions; online, from one user and a set of candidate
items at the request time. Both go through ``join_rows`` so the workflow sees identical
inputs for identical (user, item, time) triples.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from core.features.ops import Columns
from core.features.spec import LIKED_RATING, WEIGHT


class AttributeTable:
    """Raw attributes indexed by id, looked up for a batch of ids with one ``searchsorted``."""

    def __init__(self, table: pd.DataFrame, key: str, columns: tuple[str, ...]) -> None:
        ordered = table.sort_values(key)
        self.keys = ordered[key].to_numpy(dtype=np.int64)
        self.columns = {c: ordered[c].to_numpy() for c in columns}

    def lookup(self, ids: np.ndarray) -> Columns:
        """Attributes of ``ids``; unknown ids get nulls (which categorify maps to bucket 0)."""
        if not self.columns:  # no attributes: nothing to look up
            return {}
        ids = np.asarray(ids, dtype=np.int64)
        position = np.minimum(np.searchsorted(self.keys, ids), max(len(self.keys) - 1, 0))
        found = self.keys[position] == ids if len(self.keys) else np.zeros(len(ids), bool)
        out: Columns = {}
        for name, values in self.columns.items():
            picked = values[position]
            if values.dtype.kind == "f":
                out[name] = np.where(found, picked, np.nan)
            else:
                picked = picked.astype(object)
                picked[~found] = None
                out[name] = picked
        return out


def join_rows(
    users: AttributeTable,
    items: AttributeTable,
    user_ids: np.ndarray,
    item_ids: np.ndarray,
    timestamps: np.ndarray,
) -> Columns:
    """Raw rows for (user, item, time) triples, ready for ``Workflow.transform``."""
    columns: Columns = {
        "user_id": np.asarray(user_ids, dtype=np.int64),
        "item_id": np.asarray(item_ids, dtype=np.int64),
        "timestamp": np.asarray(timestamps, dtype=np.int64),
    }
    columns.update(users.lookup(user_ids))
    columns.update(items.lookup(item_ids))
    return columns


def labelled_rows(
    interactions: pd.DataFrame, users: AttributeTable, items: AttributeTable
) -> Columns:
    """Offline rows with ``rating``, the ranking ``label`` (rating >= 4) and, when the
    interactions carry them, their ``weight``."""
    columns = join_rows(
        users,
        items,
        interactions["user_id"].to_numpy(),
        interactions["item_id"].to_numpy(),
        interactions["timestamp"].to_numpy(),
    )
    rating = interactions["rating"].to_numpy(dtype=np.float32)
    columns["rating"] = rating
    columns["label"] = (rating >= LIKED_RATING).astype(np.float32)
    if WEIGHT in interactions:  # a dataset file's event weights (purchase 3, click 1, ...)
        columns[WEIGHT] = interactions[WEIGHT].to_numpy(dtype=np.float32)
    return columns
