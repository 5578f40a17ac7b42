"""Non-inferiority outcomes: shown non-inferior, shown worse, or not enough evidence."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from control.validation.config import GateConfig
from control.validation.holdout import EvalSet
from control.validation.non_inferiority import (
    INSUFFICIENT,
    NON_INFERIOR,
    WORSE,
    non_inferiority_checks,
    non_inferiority_outcome,
    users_needed_factor,
)
from control.validation.scoring import Scored
from control.validation.verdict import Verdict, table


@pytest.mark.parametrize(
    ("low", "high", "outcome"),
    [
        (-0.02, 0.10, NON_INFERIOR),
        (-0.40, -0.10, WORSE),
        (-0.20, 0.10, INSUFFICIENT),
        (-0.20, -0.03, INSUFFICIENT),  # below zero, but not shown beyond the margin
        (float("nan"), float("nan"), INSUFFICIENT),
    ],
)
def test_outcome_of_an_interval(low: float, high: float, outcome: str) -> None:
    assert non_inferiority_outcome((low + high) / 2, low, high, 0.05) == outcome


def test_users_needed_at_the_same_difference() -> None:
    # half-width 0.2 at a point estimate of 0: the margin 0.1 needs half that width, 4x users
    assert users_needed_factor(0.0, -0.2, 0.1) == pytest.approx(4.0)
    assert users_needed_factor(-0.1, -0.3, 0.05) is None  # no holdout size would do
    assert users_needed_factor(float("nan"), -0.3, 0.05) is None


def _scored(recall: np.ndarray, logits: np.ndarray) -> Scored:
    return Scored(
        retrieval={"recall@10": recall, "ndcg@10": recall},
        tail={},
        logits=logits,
        queries=np.zeros((len(recall), 2)),
    )


def test_checks_say_which_way_they_failed() -> None:
    rng = np.random.default_rng(0)
    users = 40
    production = rng.random(users)
    rows = pd.DataFrame(
        {
            "user_id": np.repeat(np.arange(users), 5),
            "item_id": np.arange(users * 5),
            "label": np.tile([1.0, 0.0, 1.0, 0.0, 0.0], users),
        }
    )
    evals = EvalSet(np.arange(users), [], [], [], rows)
    logits = np.where(rows["label"] == 1, 1.0, -1.0) + rng.normal(0, 0.5, len(rows))
    config = GateConfig.model_validate(
        {"non_inferiority": {"margins": {"recall@10": 0.1, "ndcg@10": 0.5, "auc": 0.01}}}
    )
    candidate = _scored(production * 0.5, logits)  # half the recall: clearly worse
    checks = {
        c.name: c
        for c in non_inferiority_checks(candidate, _scored(production, logits), evals, config)
    }
    assert checks["non_inferiority.recall@10"].outcome == WORSE
    assert "WORSE" in checks["non_inferiority.recall@10"].detail
    assert checks["non_inferiority.auc"].outcome == NON_INFERIOR  # identical scores
    flat = np.full(users, 0.5)
    noisy = _scored(np.tile([0.1, 0.85], users // 2), logits)  # -5 %, but widely spread
    checks = {
        c.name: c for c in non_inferiority_checks(noisy, _scored(flat, logits), evals, config)
    }
    unsure = checks["non_inferiority.recall@10"]
    assert unsure.outcome == INSUFFICIENT and not unsure.passed
    assert "INSUFFICIENT EVIDENCE" in unsure.detail and "x the holdout users" in unsure.detail
    assert "holdout too small" in unsure.detail and "more users" in unsure.detail
    assert "more ranking rows" in unsure.detail
    low, high = unsure.interval or (0.0, 0.0)
    assert f"interval width {high - low:.3g} on {users} users" in unsure.detail
    assert checks["non_inferiority.ndcg@10"].outcome == NON_INFERIOR  # a 50 % margin
    verdict = Verdict(2, 1, list(checks.values()), "d", "h", {})
    assert verdict.as_dict()["insufficient_evidence"] == ["non_inferiority.recall@10"]
    assert verdict.as_dict()["worse"] == []
    assert "insufficient evidence (the holdout cannot tell, not shown worse)" in table(verdict)
    sized = Verdict(2, 1, [], "d", "h", {"rows": 1200, "users": 300, "ranking_rows": 900})
    assert "holdout: 1,200 rows, 300 users with a new positive, 900 ranking rows" in table(sized)


def test_nothing_to_compare_on_is_insufficient_evidence() -> None:
    no_rows = pd.DataFrame({"user_id": [], "item_id": [], "label": []})
    evals = EvalSet(np.arange(3), [], [], [], no_rows)  # users, but no ranking rows
    scored = _scored(np.array([0.2, 0.4, 0.6]), np.zeros(0))
    checks = {c.name: c for c in non_inferiority_checks(scored, scored, evals, GateConfig())}
    assert checks["non_inferiority.recall@10"].outcome == NON_INFERIOR  # identical
    for name in ("non_inferiority.auc", "non_inferiority.logloss"):
        assert checks[name].outcome == INSUFFICIENT and not checks[name].passed
        assert "no holdout ranking rows" in checks[name].detail
    nobody = EvalSet(np.zeros(0, np.int64), [], [], [], no_rows)
    empty = _scored(np.zeros(0), np.zeros(0))
    checks = {c.name: c for c in non_inferiority_checks(empty, empty, nobody, GateConfig())}
    assert "no holdout users" in checks["non_inferiority.recall@10"].detail
