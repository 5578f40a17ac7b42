"""The retrieval protocol on prepared data: full ranking of one split, earlier splits excluded."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pipelines.evaluation.metrics import retrieval_metrics
from pipelines.prepare import RetrievalData


def seen_pairs(data: RetrievalData, split: str) -> np.ndarray:
    """Pairs excluded when ranking ``split``: training (and, for test, validation) positives."""
    parts = ["train"] if split == "valid" else ["train", "valid"]
    return np.concatenate([data.positives[p] for p in parts])


def evaluate_split(
    score_users: Callable[[np.ndarray], np.ndarray],
    data: RetrievalData,
    split: str = "test",
    max_users: int | None = None,
) -> dict[str, float]:
    """Recall/NDCG@10/20 of ``score_users`` on ``split`` (a seeded user sample if
    ``max_users``: the same users for every model)."""
    return retrieval_metrics(
        score_users,
        data.positives[split],
        seen_pairs(data, split),
        len(data.user_ids),
        max_users=max_users,
    )
