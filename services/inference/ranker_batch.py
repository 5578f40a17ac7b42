"""Scoring several ranker requests at once: what the Triton ranker's ``execute()`` does with
the requests Triton hands it together (dynamic batching).

The candidates of every well-formed request are stacked into one embedding lookup, one DLRM
run and one LightGBM call, and the scores are split back in request order. A malformed
request gets its own error and never fails the others; if the stacked call itself fails,
each request is scored alone so the error lands only on the request that causes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


class Scorer(Protocol):
    """What batching needs of a ranking model (``RankingModel``)."""

    def check_inputs(self, sparse: np.ndarray, dense: np.ndarray) -> None: ...

    def score(self, sparse: np.ndarray, dense: np.ndarray) -> tuple[np.ndarray, bool]: ...


@dataclass(frozen=True)
class RankerInputs:
    sparse: np.ndarray
    dense: np.ndarray


@dataclass(frozen=True)
class RankerOutputs:
    scores: np.ndarray  # [N] float32
    degraded: bool  # default embedding rows were served (the cache's store failed)


Outcome = RankerOutputs | Exception


def score_requests(model: Scorer, requests: list[RankerInputs | Exception]) -> list[Outcome]:
    """One outcome per request, in order: outputs, or the exception that request earned (an
    exception given in ``requests``, e.g. an input that could not be read, is passed on)."""
    outcomes: dict[int, Outcome] = {}
    batch: dict[int, RankerInputs] = {}
    for i, request in enumerate(requests):
        if isinstance(request, Exception):
            outcomes[i] = request
            continue
        try:
            model.check_inputs(request.sparse, request.dense)
        except ValueError as error:
            outcomes[i] = error
            continue
        batch[i] = request
    if len(batch) > 1:
        outcomes.update(_score_stacked(model, batch))
    else:
        outcomes.update({i: _score_one(model, r) for i, r in batch.items()})
    return [outcomes[i] for i in range(len(requests))]


def _score_stacked(model: Scorer, batch: dict[int, RankerInputs]) -> dict[int, Outcome]:
    inputs = list(batch.values())
    try:
        scores, degraded = model.score(
            np.concatenate([r.sparse for r in inputs]), np.concatenate([r.dense for r in inputs])
        )
        ends = np.cumsum([len(r.sparse) for r in inputs])[:-1]
        parts = np.split(np.asarray(scores, dtype=np.float32).reshape(-1), ends)
    except Exception:  # find the culprit: each request alone
        return {i: _score_one(model, r) for i, r in batch.items()}
    return {i: RankerOutputs(part, degraded) for i, part in zip(batch, parts, strict=True)}


def _score_one(model: Scorer, request: RankerInputs) -> Outcome:
    try:
        scores, degraded = model.score(request.sparse, request.dense)
    except Exception as error:
        return error
    return RankerOutputs(np.asarray(scores, dtype=np.float32).reshape(-1), degraded)
