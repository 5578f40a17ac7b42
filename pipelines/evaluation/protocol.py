"""The retrieval protocol on prepared data: full ranking of one split, earlier splits excluded."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pipelines.evaluation.metrics import group_positives, mean_retrieval
from pipelines.prepare import RetrievalData


def seen_pairs(data: RetrievalData, split: str) -> np.ndarray:
    """Pairs excluded when ranking ``split``: training (and, for test, validation) positives."""
    parts = ["train"] if split == "valid" else ["train", "valid"]
    return np.concatenate([data.positives[p] for p in parts])


def split_groups(data: RetrievalData, split: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per user position: the relevant items of ``split`` and the items excluded from its
    ranking (``seen_pairs``). Grouped once per split and kept on ``data``: at 100k users and
    10M interactions each grouping sorts millions of pairs, and every model is evaluated on
    the same splits."""
    key = f"groups:{split}"
    if key not in data.derived:
        n_users = len(data.user_ids)
        data.derived[key] = (
            group_positives(data.positives[split], n_users),
            group_positives(seen_pairs(data, split), n_users),
        )
    groups: tuple[list[np.ndarray], list[np.ndarray]] = data.derived[key]
    return groups


def evaluate_split(
    score_users: Callable[[np.ndarray], np.ndarray],
    data: RetrievalData,
    split: str = "test",
    max_users: int | None = None,
) -> dict[str, float]:
    """Recall/NDCG@10/20 of ``score_users`` on ``split`` (a seeded user sample if
    ``max_users``: the same users for every model)."""
    truth, seen = split_groups(data, split)
    return mean_retrieval(score_users, truth, seen, max_users)
