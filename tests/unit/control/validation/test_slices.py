from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from control.validation.config import GateConfig, SliceRule
from control.validation.gate import slice_checks
from control.validation.holdout import Holdout, build_eval_set
from control.validation.scoring import Scored
from core.errors import ConfigError


def _rows(triples: list[tuple[int, int, float, int]]) -> pd.DataFrame:
    return pd.DataFrame(triples, columns=["user_id", "item_id", "rating", "timestamp"])


@pytest.fixture
def holdout() -> Holdout:
    users = pd.DataFrame({"user_id": np.arange(1, 6)})
    items = pd.DataFrame({"item_id": np.arange(1, 11)})
    before = _rows(
        [(1, i, 4.0, i) for i in range(1, 9)]  # user 1: heavy
        + [(2, 1, 4.0, 1), (3, 1, 2.0, 2), (4, 2, 5.0, 3)]
    )
    rows = _rows(
        [
            (1, 9, 5.0, 20),  # new positive, long-tail item
            (1, 3, 1.0, 21),  # seen before, disliked
            (2, 2, 1.0, 22),
            (2, 10, 4.0, 23),
            (5, 1, 4.0, 24),  # user 5: new user
            (5, 4, 2.0, 25),
            (3, 5, 3.0, 26),  # rating 3: positive for retrieval, dropped for ranking
            (2, 1, 5.0, 27),  # liked again, but seen before: not a retrieval positive
        ]
    )
    return Holdout(users, items, before, rows)


def test_eval_set_positives_slices_and_rows(holdout: Holdout) -> None:
    config = GateConfig.model_validate(
        {"slice_definitions": {"heavy_user_fraction": 0.25, "head_item_fraction": 0.2}}
    )
    evals = build_eval_set(holdout, config)
    assert evals.users.tolist() == [1, 2, 3, 5]
    assert [t.tolist() for t in evals.truth] == [[9], [10], [5], [1]]
    assert evals.seen[0].tolist() == list(range(1, 9)) and len(evals.seen[3]) == 0
    assert evals.user_slices["new_users"].tolist() == [False, False, False, True]
    assert evals.user_slices["heavy_users"].tolist() == [True, False, False, False]
    # head = the 2 most popular items before the window (1 and 2)
    assert evals.user_slices["long_tail_items"].tolist() == [True, True, True, False]
    assert len(evals.rank_rows) == 7 and 3 not in evals.rank_rows["user_id"].tolist()
    assert evals.rank_rows["label"].tolist() == [1, 0, 0, 1, 1, 0, 1]
    assert evals.row_slices["new_users"].tolist() == [False, False, False, False, True, True, False]


def _scored(n_users: int, n_rows: int) -> Scored:
    return Scored(
        retrieval={"recall@10": np.full(n_users, 0.5), "ndcg@10": np.full(n_users, 0.5)},
        tail={"recall@10": np.full(n_users, 0.5)},
        logits=np.linspace(-1, 1, n_rows),
        queries=np.zeros((n_users, 4)),
    )


def test_a_slice_below_its_minimum_fails_as_missing(holdout: Holdout) -> None:
    config = GateConfig(
        slices={"new_users": SliceRule(min_users=2, min_rows=1, floors={"recall@10": 0.1})}
    )
    evals = build_eval_set(holdout, config)
    checks = {c.name: c for c in slice_checks(_scored(4, 7), evals, config)}
    assert not checks["slice.new_users.sample"].passed
    assert "slice missing" in checks["slice.new_users.sample"].detail
    assert not checks["slice.new_users.recall@10"].passed  # value fine, but no sample


def test_a_slice_with_its_sample_is_judged_by_its_floors(holdout: Holdout) -> None:
    config = GateConfig(
        slices={
            "heavy_users": SliceRule(min_users=1, min_rows=1, floors={"recall@10": 0.4}),
            "long_tail_items": SliceRule(min_users=1, min_rows=1, floors={"recall@10": 0.6}),
        }
    )
    evals = build_eval_set(holdout, config)
    checks = {c.name: c for c in slice_checks(_scored(4, 7), evals, config)}
    assert checks["slice.heavy_users.sample"].passed
    assert checks["slice.heavy_users.recall@10"].passed
    assert not checks["slice.long_tail_items.recall@10"].passed  # 0.5 < 0.6


def test_an_unknown_slice_is_a_config_error(holdout: Holdout) -> None:
    config = GateConfig(slices={"vip": SliceRule()})
    with pytest.raises(ConfigError, match="vip"):
        slice_checks(_scored(4, 7), build_eval_set(holdout, config), config)
