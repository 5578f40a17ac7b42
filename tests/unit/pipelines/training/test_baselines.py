"""The retrieval baselines: negatives that are never positives, EASE's closed form."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.errors import ConfigError
from pipelines.models.bpr import BPRMF, INIT_STD
from pipelines.models.ease import EASE, gram
from pipelines.training.baselines import NegativeSampler


def test_negatives_are_never_the_users_positives() -> None:
    rng = np.random.default_rng(0)
    n_users, n_items = 50, 40
    positives = np.stack(
        [rng.integers(0, n_users, 1500), rng.integers(0, n_items, 1500)], axis=1
    )  # dense: each user likes about half the catalog
    sampler = NegativeSampler(positives, n_items, torch.Generator().manual_seed(0))
    users = torch.from_numpy(np.repeat(np.arange(n_users), 200))
    negatives = sampler(users).numpy()
    liked = set(map(tuple, positives.tolist()))
    assert not any((u, i) in liked for u, i in zip(users.tolist(), negatives.tolist(), strict=True))
    assert sampler.collisions == 0
    assert len(np.unique(negatives)) > n_items // 2  # still spread over the catalog


def test_a_user_who_likes_everything_keeps_counted_collisions() -> None:
    positives = np.stack([np.zeros(5, np.int64), np.arange(5)], axis=1)
    sampler = NegativeSampler(positives, 5, torch.Generator().manual_seed(0), rounds=3)
    sampler(torch.zeros(10, dtype=torch.long))
    assert sampler.collisions == 10


def test_bpr_factors_start_small() -> None:
    torch.manual_seed(0)
    model = BPRMF(1000, 2000, dim=32)
    assert float(model.items.weight.detach().std()) == pytest.approx(INIT_STD, rel=0.05)


def _toy_pairs() -> np.ndarray:
    # items 0 and 1 always together; items 2 and 3 always together
    pairs = [(u, i) for u in range(20) for i in ((0, 1) if u % 2 else (2, 3))]
    pairs += [(20, 0), (21, 2)]  # two users with one item each
    return np.asarray(pairs, dtype=np.int64)


def test_ease_recommends_the_co_occurring_item_and_never_the_item_itself() -> None:
    pairs = _toy_pairs()
    model = EASE.fit(gram(pairs, 22, 4), 1.0, pairs, 22)
    assert torch.all(model.weights.diagonal() == 0)
    scores = model.scores(np.array([20, 21]))
    assert scores[0].argmax() == 1 and scores[1].argmax() == 3


def test_ease_solves_its_normal_equations() -> None:
    rng = np.random.default_rng(1)
    pairs = np.stack([rng.integers(0, 30, 200), rng.integers(0, 12, 200)], axis=1)
    matrix = gram(pairs, 30, 12)
    model = EASE.fit(matrix, 5.0, pairs, 30)
    b = model.weights.double()
    # stationarity off the diagonal: (G + l2 I) B - G is zero outside the diagonal
    residual = (matrix + 5.0 * torch.eye(12, dtype=matrix.dtype)) @ b - matrix
    off = residual - torch.diag(residual.diagonal())
    assert float(off.abs().max()) < 1e-3


def test_ease_rejects_a_non_positive_l2() -> None:
    pairs = _toy_pairs()
    with pytest.raises(ConfigError, match="positive l2"):
        EASE.fit(gram(pairs, 22, 4), 0.0, pairs, 22)
