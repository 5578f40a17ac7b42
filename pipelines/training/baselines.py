"""The retrieval baselines, each trained as carefully as the two-tower: popularity, BPR-MF
(negatives that are never the user's positives, N(0, 0.01) init, early stopping and
keep-best on validation NDCG@10) and EASE (closed form, regularisation chosen on
validation, when the catalog is small enough for an items x items matrix)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from pipelines.config import TrainConfig
from pipelines.evaluation.protocol import evaluate_split
from pipelines.models.bpr import BPRMF
from pipelines.models.ease import EASE, gram
from pipelines.prepare import RetrievalData
from pipelines.training.loop import EarlyStopping, device, train_epochs

SELECTION_METRIC = "ndcg@10"  # every retrieval model is selected on validation NDCG@10
EASE_L2_GRID = (50.0, 200.0, 500.0, 1000.0)
BPR_BATCH = 1024


def popularity(data: RetrievalData) -> np.ndarray:
    """Training-positive counts per catalog item."""
    return np.bincount(data.positives["train"][:, 1], minlength=len(data.item_ids)).astype(
        np.float32
    )


class PopularityRanking:
    """Popularity as a scorer (a ``DirectRanker``): every user gets the same scores, so one
    ranking of the catalog serves all of them; a user's top ``k`` are the first ``k`` of it
    they have not seen (ties: the lower position first)."""

    def __init__(self, counts: np.ndarray) -> None:
        self.counts = counts
        self.order = np.argsort(-counts, kind="stable")

    def __call__(self, users: np.ndarray) -> np.ndarray:
        return np.broadcast_to(self.counts, (len(users), len(self.counts)))

    def top(self, user: int, seen: np.ndarray, k: int) -> np.ndarray:
        head = self.order[: k + len(seen)]  # holds k unseen items, whatever was seen
        return head[~np.isin(head, seen)][:k]


def popularity_scores(data: RetrievalData) -> PopularityRanking:
    return PopularityRanking(popularity(data))


class NegativeSampler:
    """Uniform negatives that are not among the user's training positives.

    Vectorised rejection: draw for the whole batch, look the (user, item) keys up in the
    sorted keys of the positives, redraw only the collisions; a user who likes nearly every
    item may keep a collision after ``rounds`` draws (counted in ``collisions``).
    """

    def __init__(
        self, positives: np.ndarray, n_items: int, generator: torch.Generator, rounds: int = 20
    ) -> None:
        self.n_items = n_items
        self.keys = torch.from_numpy(
            np.unique(positives[:, 0].astype(np.int64) * n_items + positives[:, 1])
        )
        self.generator = generator
        self.rounds = rounds
        self.collisions = 0

    def _is_positive(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        keys = users * self.n_items + items
        where = torch.searchsorted(self.keys, keys).clamp(max=len(self.keys) - 1)
        return self.keys[where] == keys

    def __call__(self, users: torch.Tensor) -> torch.Tensor:
        items = torch.randint(0, self.n_items, (len(users),), generator=self.generator)
        if len(self.keys) == 0:
            return items
        for _ in range(self.rounds):
            bad = torch.nonzero(self._is_positive(users, items)).squeeze(1)
            if len(bad) == 0:
                return items
            items[bad] = torch.randint(0, self.n_items, (len(bad),), generator=self.generator)
        self.collisions += int(self._is_positive(users, items).sum())
        return items


def bpr_scores(model: BPRMF) -> Callable[[np.ndarray], np.ndarray]:
    """Scores of the model's factors by numpy's BLAS, on every core (faster than torch's
    matmul on the training step's one thread: docs/benchmarks/code-notes.md)."""
    users = model.users.weight.detach().cpu().numpy()
    items = model.items.weight.detach().cpu().numpy()
    return lambda chosen: users[chosen] @ items.T


def train_bpr(
    data: RetrievalData, config: TrainConfig, report: Callable[[str], None] | None = None
) -> tuple[BPRMF, list[dict[str, float]]]:
    """BPR-MF with early stopping and keep-best on validation NDCG@10."""
    model = BPRMF(len(data.user_ids), len(data.item_ids), dim=config.bpr_dim).to(device())
    pairs = torch.from_numpy(data.positives["train"])
    generator = torch.Generator().manual_seed(config.seed)
    negatives = NegativeSampler(data.positives["train"], len(data.item_ids), generator)

    def epoch(_: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(users, positives, negatives) on the CPU, by the seeded generator, whatever the
        model's device (train_epochs moves each batch there)."""
        for rows in torch.randperm(len(pairs), generator=generator).split(BPR_BATCH):
            users = pairs[rows, 0]
            yield users, pairs[rows, 1], negatives(users)

    def loss(users: torch.Tensor, items: torch.Tensor, drawn: torch.Tensor) -> torch.Tensor:
        return model.loss(users, items, drawn, l2=config.bpr_l2)

    def validate(_: int) -> dict[str, float]:
        metrics = evaluate_split(bpr_scores(model), data, "valid", config.valid_users)
        return {f"valid_{name}": value for name, value in metrics.items()}

    curve = train_epochs(
        model,
        epoch,
        loss,
        config.bpr_epochs,
        config.bpr_lr,
        "bpr-mf",
        stopping=EarlyStopping(
            validate, f"valid_{SELECTION_METRIC}", config.patience, config.eval_every
        ),
        batches_per_epoch=-(-len(pairs) // BPR_BATCH),
        report=report,
    )
    return model.cpu(), curve


def train_ease(
    data: RetrievalData, config: TrainConfig, report: Callable[[str], None] | None = None
) -> tuple[EASE | None, dict[str, Any]]:
    """EASE with the L2 of ``EASE_L2_GRID`` that is best on validation NDCG@10, or None (and
    the reason) when the catalog exceeds ``config.ease_max_items``."""
    n_items = len(data.item_ids)
    if n_items > config.ease_max_items:
        reason = f"skipped: {n_items} items > ease_max_items={config.ease_max_items}"
        (report or print)(f"ease: {reason}")
        return None, {"skipped": reason}
    train, n_users = data.positives["train"], len(data.user_ids)
    matrix = gram(train, n_users, n_items)
    best: tuple[float, EASE | None, float] = (-1.0, None, 0.0)
    curve = []
    for l2 in EASE_L2_GRID:
        model = EASE.fit(matrix, l2, train, n_users)
        value = evaluate_split(model.scores, data, "valid", config.valid_users)[SELECTION_METRIC]
        curve.append({"l2": l2, f"valid_{SELECTION_METRIC}": value})
        (report or print)(f"ease l2={l2:g}: valid_{SELECTION_METRIC}={value:.4f}")
        if value > best[0]:
            best = (value, model, l2)
    return best[1], {"l2": best[2], "curve": curve}
