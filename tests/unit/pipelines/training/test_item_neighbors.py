"""The item-neighbour source: co-occurrence cosine, bounded building, a user's candidates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core.item_neighbors import ItemNeighbors
from pipelines.evaluation.metrics import DirectRanker, ranked_tops
from pipelines.training.item_neighbors import (
    NeighborRanking,
    build_item_neighbors,
    capped_positives,
)


def pairs(rows: dict[int, list[int]]) -> np.ndarray:
    return np.asarray([(u, i) for u, items in rows.items() for i in items], dtype=np.int64)


def test_items_liked_together_are_neighbours_and_popularity_does_not_dominate() -> None:
    # 0 and 1 always together; 2 is liked by everyone (popular) but tells nothing
    liked = {u: [0, 1, 2] for u in range(5)} | {u: [2, 3] for u in range(5, 40)}
    table = build_item_neighbors(pairs(liked), n_items=5, width=3)
    assert table.neighbors[0, 0] == 1 and table.neighbors[1, 0] == 0
    assert table.similarity[0, 0] == pytest.approx(1.0)  # 5 / sqrt(5 * 5)
    assert table.similarity[0, 1] == pytest.approx(5 / np.sqrt(5 * 40))  # item 2: weaker
    assert table.neighbors[4].tolist() == [-1, -1, -1]  # never liked: no neighbours
    assert (np.diff(table.similarity, axis=1) <= 0).all()  # best first
    assert not (table.neighbors == np.arange(5)[:, None]).any()  # never itself


def test_a_user_gets_the_neighbours_of_their_history_summed_and_never_the_history() -> None:
    table = ItemNeighbors(
        neighbors=np.asarray([[2, 3], [3, 4], [0, -1], [0, 1], [1, -1]], np.int32),
        similarity=np.asarray([[0.9, 0.2], [0.5, 0.4], [0.9, 0], [0.2, 0.5], [0.4, 0]], np.float32),
    )
    items, scores = table.candidates(np.asarray([0, 1]), count=10)
    assert items.tolist() == [2, 3, 4]  # 3: 0.2 + 0.5
    assert scores == pytest.approx([0.9, 0.7, 0.4])
    items, _ = table.candidates(np.asarray([0, 1, 99, -1]), count=2)  # unknown ones ignored
    assert items.tolist() == [2, 3]
    assert len(table.candidates(np.zeros(0, np.int64), 5)[0]) == 0
    assert len(table.candidates(np.asarray([0]), 0)[0]) == 0
    full = table.scores([np.asarray([0, 1])])
    assert full[0].tolist() == pytest.approx([0, 0, 0.9, 0.7, 0.4])


def test_building_is_bounded_per_user() -> None:
    rng = np.random.default_rng(0)
    heavy = {0: list(range(500))} | {
        u: rng.choice(500, 5, replace=False).tolist() for u in range(1, 50)
    }
    users, items = capped_positives(pairs(heavy), items_per_user=20)
    assert np.bincount(users).max() == 20 and len(set(zip(users, items, strict=True))) == len(users)
    # the pair budget lowers the cap further: 50 users x 4 ** 2 <= 800
    table = build_item_neighbors(pairs(heavy), 500, width=10, items_per_user=50, max_pairs=800)
    assert table.neighbors.shape == (500, 10)
    with pytest.raises(ValueError, match="width must be"):
        build_item_neighbors(pairs(heavy), 500, width=0)


def test_the_table_survives_a_round_trip_and_a_bad_file_is_refused(tmp_path: Path) -> None:
    table = build_item_neighbors(pairs({0: [0, 1], 1: [1, 2]}), 3, width=2)
    table.save(tmp_path / "t")
    for mmap in (False, True):
        loaded = ItemNeighbors.load(tmp_path / "t", mmap=mmap)
        assert np.array_equal(loaded.neighbors, table.neighbors)
        assert np.array_equal(loaded.similarity, table.similarity)
        assert loaded.candidates(np.asarray([0]), 5)[0].tolist() == [1]
    np.save(tmp_path / "t" / "similarity.npy", np.zeros((3, 1), np.float32))
    with pytest.raises(ValueError, match="int32 and float32"):
        ItemNeighbors.load(tmp_path / "t")


def test_candidate_sources_counts_what_each_candidate_set_recalls() -> None:
    """Two users, six items, a budget of 3 with 1 place for neighbours, worked by hand."""
    from types import SimpleNamespace

    from pipelines.training.retrieval import candidate_sources

    scores = np.array([[6, 5, 4, 3, 2, 1], [1, 2, 3, 4, 5, 6]], dtype=np.float32)
    data = SimpleNamespace(
        user_ids=np.array([10, 11]),
        positives={
            "train": np.array([[0, 0], [1, 5]]),  # seen: user 0 item 0, user 1 item 5
            "valid": np.zeros((0, 2), np.int64),
            "test": np.array([[0, 3], [0, 4], [1, 0]]),
        },
        derived={},
    )
    table = ItemNeighbors(
        np.array([[-1], [4], [0], [-1], [-1], [-1]], dtype=np.int32),
        np.array([[0], [0.9], [0.8], [0], [0], [0]], dtype=np.float32),
    )
    measured = candidate_sources(
        lambda users: scores[users],
        table,
        [np.array([1]), np.array([2])],
        data,  # type: ignore[arg-type]
        None,
        budget=3,
        share=1,
    )
    # ANN: user 0 gets [1, 2, 3] (item 0 seen): 1 of its 2 test items; user 1 gets [4, 3, 2]:
    # none. With the neighbour place: user 0 [1, 2, 4] (1 of 2), user 1 [4, 3, 0] (1 of 1).
    assert measured == {
        "budget": 3,
        "recall@3 ann": 0.25,
        "recall@3 ann+item_neighbors_1": 0.75,
    }


def test_the_neighbour_ranking_gives_each_user_the_full_rankings_top_without_scoring_all() -> None:
    rng = np.random.default_rng(1)
    liked = {u: rng.choice(200, rng.integers(1, 12), replace=False).tolist() for u in range(300)}
    table = build_item_neighbors(pairs(liked), n_items=200, width=8)
    histories = [np.asarray(liked[u][-5:]) for u in range(300)]
    ranking = NeighborRanking(table, histories)
    assert isinstance(ranking, DirectRanker)
    seen = [np.asarray(liked[u]) for u in range(300)]  # the history is among what was seen
    users = np.arange(300)
    direct = dict(ranked_tops(ranking, users, seen, 20))
    full = dict(ranked_tops(lambda u: ranking(u), users, seen, 20))
    scores = ranking(users)
    for u in users.tolist():
        assert len(direct[u]) == 20 and not np.isin(direct[u], seen[u]).any()
        # the same scores in the same order (ties may pick other items of equal score)
        assert scores[u, direct[u]] == pytest.approx(scores[u, full[u]], rel=1e-5)
        scored = direct[u][scores[u, direct[u]] > 0]
        unscored = direct[u][len(scored) :]
        assert scored.tolist() == table.candidates(histories[u], 20, seen[u])[0].tolist()
        # what has no score is filled from the lowest unseen positions up
        free = np.setdiff1d(np.arange(200), np.concatenate([seen[u], scored]))
        assert unscored.tolist() == free[: len(unscored)].tolist()
