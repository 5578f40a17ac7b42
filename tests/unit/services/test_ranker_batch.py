"""The Triton ranker's batching: requests stacked into one scoring call, outputs split back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from services.inference.embeddings import InMemoryTables
from services.inference.models import RankingModel
from services.inference.ranker_batch import RankerInputs, RankerOutputs, score_requests


class CountingScorer:
    """Scores a row as the sum of its ids plus its dense values; counts calls; fails on a
    row whose first id is ``poison``."""

    def __init__(self, poison: int | None = None, degraded: bool = False) -> None:
        self.calls: list[int] = []
        self.poison = poison
        self.degraded = degraded

    def check_inputs(self, sparse: np.ndarray, dense: np.ndarray) -> None:
        if sparse.ndim != 2 or sparse.shape[1] != 3:
            raise ValueError(f"sparse must be [N, 3], got {list(sparse.shape)}")
        if dense.shape != (len(sparse), 2):
            raise ValueError(f"dense must be [{len(sparse)}, 2], got {list(dense.shape)}")

    def score(self, sparse: np.ndarray, dense: np.ndarray) -> tuple[np.ndarray, bool]:
        self.calls.append(len(sparse))
        if self.poison is not None and (sparse[:, 0] == self.poison).any():
            raise RuntimeError("poisoned row")
        return sparse.sum(axis=1) + dense.sum(axis=1), self.degraded


def _request(rows: int, start: int = 0) -> RankerInputs:
    sparse = np.arange(start, start + rows * 3, dtype=np.int64).reshape(rows, 3)
    return RankerInputs(sparse, np.full((rows, 2), 0.5, dtype=np.float32))


def _expected(request: RankerInputs) -> np.ndarray:
    return (request.sparse.sum(axis=1) + request.dense.sum(axis=1)).astype(np.float32)


def test_requests_of_mixed_sizes_are_scored_in_one_call_and_split_in_order() -> None:
    scorer = CountingScorer(degraded=True)
    requests = [_request(5), _request(1, 100), _request(300, 7)]
    outcomes = score_requests(scorer, list(requests))
    assert scorer.calls == [306]  # one stacked call
    for request, outcome in zip(requests, outcomes, strict=True):
        assert isinstance(outcome, RankerOutputs)
        np.testing.assert_array_equal(outcome.scores, _expected(request))
        assert outcome.degraded


def test_a_malformed_request_gets_its_error_and_the_others_their_scores() -> None:
    scorer = CountingScorer()
    bad = RankerInputs(np.zeros((4, 2), np.int64), np.zeros((4, 2), np.float32))
    unreadable = KeyError("no input tensor 'dense'")
    good = [_request(3), _request(2, 50)]
    outcomes = score_requests(scorer, [good[0], bad, unreadable, good[1]])
    assert scorer.calls == [5]
    assert isinstance(outcomes[1], ValueError) and "sparse must be [N, 3]" in str(outcomes[1])
    assert outcomes[2] is unreadable
    for index, request in ((0, good[0]), (3, good[1])):
        outcome = outcomes[index]
        assert isinstance(outcome, RankerOutputs)
        np.testing.assert_array_equal(outcome.scores, _expected(request))


def test_a_request_that_fails_the_stacked_call_fails_alone() -> None:
    scorer = CountingScorer(poison=999)
    poisoned = RankerInputs(np.full((2, 3), 999, np.int64), np.zeros((2, 2), np.float32))
    good = [_request(3), _request(4, 10)]
    outcomes = score_requests(scorer, [good[0], poisoned, good[1]])
    assert scorer.calls == [9, 3, 2, 4]  # the stacked call, then each alone
    assert isinstance(outcomes[1], RuntimeError) and "poisoned" in str(outcomes[1])
    assert isinstance(outcomes[0], RankerOutputs) and isinstance(outcomes[2], RankerOutputs)
    np.testing.assert_array_equal(outcomes[2].scores, _expected(good[1]))


def test_no_request_and_only_bad_requests_call_nothing() -> None:
    scorer = CountingScorer()
    assert score_requests(scorer, []) == []
    outcomes = score_requests(scorer, [ValueError("unreadable")])
    assert scorer.calls == [] and isinstance(outcomes[0], ValueError)


def test_the_real_ranker_scores_a_batch_like_each_request_alone(exported: Path) -> None:
    directory = exported / "model_repository" / "ranker" / "1"
    model = RankingModel(directory, embeddings=InMemoryTables.load(directory / "embeddings"))
    model.load()
    rng = np.random.default_rng(0)
    requests = [
        RankerInputs(
            rng.integers(0, 20, size=(n, model.tables)).astype(np.int64),
            rng.normal(size=(n, model.dense_width)).astype(np.float32),
        )
        for n in (1, 37, 300)
    ]
    together = score_requests(model, list(requests))
    for request, outcome in zip(requests, together, strict=True):
        alone, degraded = model.score(request.sparse, request.dense)
        assert isinstance(outcome, RankerOutputs) and not degraded
        np.testing.assert_allclose(outcome.scores, alone, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="sparse must be"):
        model.check_inputs(requests[0].sparse[:, :-1], requests[0].dense)
    with pytest.raises(ValueError, match="dense must be"):
        model.check_inputs(requests[0].sparse, requests[0].dense[:, :-1])
    with pytest.raises(ValueError, match="rows"):
        model.check_inputs(requests[1].sparse, requests[0].dense)
    with pytest.raises(ValueError, match="integer"):
        model.check_inputs(requests[0].sparse.astype(np.float32), requests[0].dense)
