from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pipelines.evaluation.metrics import (
    DirectRanker,
    auc,
    logloss,
    ranked_tops,
    retrieval_metrics,
)
from pipelines.training.baselines import PopularityRanking


def test_recall_and_ndcg_on_a_hand_checked_ranking() -> None:
    # 1 user, 30 items; scores rank items 0,1,2,... ; item 0 is seen (excluded)
    scores = -np.arange(30, dtype=np.float32)[None, :]
    test = np.array([[0, 1], [0, 12], [0, 25]])
    seen = np.array([[0, 0]])
    metrics = retrieval_metrics(lambda users: scores[users * 0], test, seen, n_users=1)
    # ranking after removing item 0: 1,2,...,20 -> item 1 at rank 1, item 12 at rank 12
    assert metrics["recall@10"] == pytest.approx(1 / 3)
    assert metrics["recall@20"] == pytest.approx(2 / 3)
    ideal10 = 1 + 1 / np.log2(3) + 1 / np.log2(4)
    assert metrics["ndcg@10"] == pytest.approx(1 / ideal10)
    assert metrics["ndcg@20"] == pytest.approx((1 + 1 / np.log2(13)) / ideal10)


def test_users_without_test_positives_are_not_counted() -> None:
    scores = np.tile(-np.arange(25, dtype=np.float32), (3, 1))
    metrics = retrieval_metrics(
        lambda users: scores[users], np.array([[2, 0]]), np.zeros((0, 2), int), n_users=3
    )
    assert metrics["recall@10"] == 1.0 and metrics["ndcg@10"] == 1.0


def test_auc_matches_pair_counting_with_ties() -> None:
    labels = np.array([1, 0, 1, 0, 1])
    scores = np.array([0.9, 0.9, 0.3, 0.1, 0.5])
    pairs = [(p, n) for p in scores[labels == 1] for n in scores[labels == 0]]
    expected = np.mean([1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs])
    assert auc(labels, scores) == pytest.approx(expected)


def test_auc_needs_both_classes() -> None:
    with pytest.raises(ValueError, match="both positive and negative"):
        auc(np.ones(3), np.arange(3))


def test_logloss() -> None:
    assert logloss(np.array([1, 0]), np.array([0.8, 0.2])) == pytest.approx(-np.log(0.8))
    assert np.isfinite(logloss(np.array([1]), np.array([0.0])))


def test_scores_are_computed_in_bounded_blocks_with_the_same_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pipelines.evaluation.metrics as metrics_module

    rng = np.random.default_rng(0)
    table = rng.random((60, 50)).astype(np.float32)
    test = np.stack([rng.integers(0, 60, 300), rng.integers(0, 50, 300)], axis=1)
    seen = np.stack([rng.integers(0, 60, 300), rng.integers(0, 50, 300)], axis=1)
    blocks: list[int] = []

    def score(users: np.ndarray) -> np.ndarray:
        blocks.append(len(users))
        return table[users]

    whole = metrics_module.retrieval_metrics(score, test, seen, 60)
    blocks.clear()
    monkeypatch.setattr(metrics_module, "SCORES_PER_CHUNK", 50 * 7)  # 7 users of 50 items
    assert metrics_module.retrieval_metrics(score, test, seen, 60) == whole
    assert blocks[0] == 1 and max(blocks) == 7


def full_ranking(scorer: Any) -> Any:
    """The same scores, seen by ``ranked_tops`` as a plain scorer (the whole catalog ranked)."""
    return lambda users: scorer(users)


def test_popularity_ranks_each_user_directly_as_a_full_ranking_would() -> None:
    rng = np.random.default_rng(0)
    counts = rng.permutation(500).astype(np.float32)  # no ties: one right answer per user
    ranking = PopularityRanking(counts)
    assert isinstance(ranking, DirectRanker)
    seen = [rng.choice(500, size, replace=False) for size in (0, 5, 60, 490)]
    users = np.arange(len(seen))
    direct = dict(ranked_tops(ranking, users, seen, 20))
    full = dict(ranked_tops(full_ranking(ranking), users, seen, 20))
    for u in users.tolist():
        assert len(direct[u]) == min(20, 500 - len(seen[u]))  # never a seen item
        assert direct[u].tolist() == full[u][: len(direct[u])].tolist()
    # with ties the same scores come first, ties by the lower position
    tied = PopularityRanking(np.asarray([1, 3, 3, 0, 3, 1], np.float32))
    assert tied.top(0, np.asarray([2]), 4).tolist() == [1, 4, 0, 5]


def test_ranked_tops_asks_a_direct_ranker_for_tops_and_never_scores_the_catalog() -> None:
    class OnlyTops:
        def __call__(self, users: np.ndarray) -> np.ndarray:
            raise AssertionError("the catalog was scored")

        def top(self, user: int, seen: np.ndarray, k: int) -> np.ndarray:
            return np.asarray([user, 7, 8])[:k]

    metrics = retrieval_metrics(OnlyTops(), np.array([[0, 7], [1, 1]]), np.zeros((0, 2), int), 2)
    assert metrics["recall@10"] == 1.0
    assert metrics["ndcg@10"] == pytest.approx((1 / np.log2(3) + 1) / 2)


def test_group_positives_sorts_each_users_items_and_keeps_repeats() -> None:
    from pipelines.evaluation.metrics import group_positives

    rng = np.random.default_rng(0)
    pairs = np.stack([rng.integers(0, 40, 500), rng.integers(0, 1000, 500)], axis=1)
    grouped = group_positives(pairs, 45)
    assert len(grouped) == 45 and all(len(grouped[u]) == 0 for u in range(40, 45))
    for user in range(40):
        assert grouped[user].tolist() == sorted(pairs[pairs[:, 0] == user, 1].tolist())
    assert [len(g) for g in group_positives(np.zeros((0, 2), np.int64), 3)] == [0, 0, 0]


def test_each_split_is_grouped_once_whatever_the_models_evaluated_on_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pipelines.evaluation import protocol
    from pipelines.prepare import RetrievalData

    rng = np.random.default_rng(1)
    pairs = np.unique(np.stack([rng.integers(0, 20, 200), rng.integers(0, 30, 200)], 1), axis=0)
    order = rng.permutation(len(pairs))
    empty = np.zeros(0)
    data = RetrievalData(
        user_ids=np.arange(20),
        item_ids=np.arange(30),
        user_features=empty,
        history=empty,
        item_features=empty,
        item_dense=empty,
        item_log_q=empty,
        positives={
            "train": pairs[order[:120]],
            "valid": pairs[order[120:160]],
            "test": pairs[order[160:]],
        },
    )
    calls: list[int] = []
    grouping = protocol.group_positives
    monkeypatch.setattr(
        protocol, "group_positives", lambda p, n: calls.append(len(p)) or grouping(p, n)
    )
    scores = rng.random((20, 30)).astype(np.float32)
    first = protocol.evaluate_split(lambda users: scores[users], data, "test")
    again = protocol.evaluate_split(lambda users: scores[users] * 2, data, "test")
    assert first == again and len(calls) == 2  # the test positives and the excluded ones
    expected = retrieval_metrics(
        lambda users: scores[users], data.positives["test"], protocol.seen_pairs(data, "test"), 20
    )
    assert first == expected
    protocol.evaluate_split(lambda users: scores[users], data, "valid")
    assert len(calls) == 4
