"""The drift reference made at export: a replay of serving-like requests through the trained
models (how and why: ``core/export/drift_reference.py``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from core.export.drift_reference import (
    DEFAULT_BINS,
    ITEM_QUANTITIES,
    USER_QUANTITIES,
    Extractor,
    Reference,
)
from core.features.rows import AttributeTable, join_rows
from core.features.spec import dense_block
from core.features.workflow import Workflow
from pipelines.prepare import user_tower_inputs

REPLAY_USERS = 1000  # users replayed at export (all of them when the catalog has fewer)
REPLAY_CANDIDATES = 300  # the gateway's default retrieval candidate count
REPLAY_SPAN_S = 7 * 86_400

Encoder = Callable[[np.ndarray, np.ndarray], np.ndarray]  # user features, history -> queries
Ranker = Callable[[np.ndarray, np.ndarray], np.ndarray]  # sparse, dense -> logits
Searcher = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]  # -> scores, positions


def _histories(online: Path, user_ids: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    table = pd.read_parquet(online / "histories.parquet").set_index("user_id")
    empty = np.zeros(0, np.int64)
    recent, seen = [], []
    for user in user_ids.tolist():
        row = table.loc[user] if user in table.index else None
        recent.append(empty if row is None else np.asarray(row["recent"], np.int64))
        seen.append(empty if row is None else np.asarray(row["seen"], np.int64))
    return recent, seen


def replay_reference(
    online: Path,
    workflow: Workflow,
    item_ids: np.ndarray,
    encode: Encoder,
    search: Searcher,
    rank: Ranker,
    history_length: int,
    exported_at: int,
    seed: int = 0,
    bins: int = DEFAULT_BINS,
    users: int = REPLAY_USERS,
    candidates: int = REPLAY_CANDIDATES,
) -> tuple[dict[str, Reference], dict]:
    """References of every quantity from a replay of serving-like requests (module docs);
    returns them and a description of the method (written into the file)."""
    rng = np.random.default_rng(seed)
    table = pd.read_parquet(online / "users.parquet")
    if len(table) > users:
        table = table.iloc[np.sort(rng.choice(len(table), users, replace=False))]
    user_ids = table["user_id"].to_numpy(np.int64)
    recent, seen = _histories(online, user_ids)
    history = np.zeros((len(user_ids), history_length), np.int64)
    for row, items in enumerate(recent):
        items = items[-history_length:]
        if len(items):
            ids = workflow.transform({"item_id": items}, partial=True)["item_id_idx"]
            history[row, history_length - len(items) :] = ids
    queries = encode(user_tower_inputs(workflow, table).astype(np.int64), history)
    scores, positions = search(np.asarray(queries, np.float32), min(candidates, len(item_ids)))
    keep = positions >= 0
    for row, items in enumerate(seen):  # the filtering stage drops what the user has seen
        keep[row] &= ~np.isin(item_ids[np.maximum(positions[row], 0)], items)
    per_user = keep.sum(axis=1)
    rows = np.repeat(np.arange(len(user_ids)), per_user)
    stamps = exported_at - rng.integers(0, REPLAY_SPAN_S, len(user_ids))
    columns = join_rows(
        AttributeTable(table, "user_id", workflow.schema.user_attributes),
        AttributeTable(
            pd.read_parquet(online / "items.parquet"), "item_id", workflow.schema.item_attributes
        ),
        user_ids[rows],
        item_ids[positions[keep]],
        stamps[rows],
    )
    encoded = workflow.transform(columns)
    schema = workflow.schema
    sparse = np.stack([encoded[c] for c in schema.sparse_columns], axis=1).astype(np.int64)
    dense = dense_block(encoded, schema)
    extract = Extractor(schema)
    probability = 1.0 / (1.0 + np.exp(-np.asarray(rank(sparse, dense), np.float64).reshape(-1)))
    first = np.r_[0, np.cumsum(per_user)[:-1]][per_user > 0]  # each user's first row
    lengths = np.asarray([min(len(r), history_length) for r in recent])[per_user > 0]
    user_block = np.stack(
        [
            extract.user_values(sparse[i], dense[i], int(n))
            for i, n in zip(first, lengths, strict=True)
        ]
    )
    item_block = extract.item_values(sparse, dense, scores[keep], probability)
    weights = 1.0 / per_user[rows]
    # a quantity whose input the schema lacks (NaN) is not monitored for this data set
    references = {
        name: Reference.fit(user_block[:, j], None, bins)
        for j, name in enumerate(USER_QUANTITIES)
        if not np.isnan(user_block[:, j]).all()
    }
    references.update(
        {
            name: Reference.fit(item_block[:, j], weights, bins)
            for j, name in enumerate(ITEM_QUANTITIES)
            if not np.isnan(item_block[:, j]).all()
        }
    )
    method = {
        "kind": "replay",
        "users": len(user_ids),
        "candidates": int(candidates),
        "bins": int(bins),
        "timestamps": [int(exported_at - REPLAY_SPAN_S), int(exported_at)],
        "seed": int(seed),
    }
    return references, method
