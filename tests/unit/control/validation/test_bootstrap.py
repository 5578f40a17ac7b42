from __future__ import annotations

import numpy as np
import pytest

from control.validation.bootstrap import (
    paired_ranking_metric,
    paired_user_metric,
    relative_difference,
    weighted_auc,
    weighted_logloss,
)
from pipelines.evaluation.metrics import auc, logloss, sigmoid


def test_weighted_metrics_with_unit_weights_equal_the_plain_ones() -> None:
    rng = np.random.default_rng(0)
    labels = rng.random(400) < 0.3
    scores = np.round(rng.normal(size=400) + labels, 1)  # ties on purpose
    assert weighted_auc(labels, scores, np.ones((3, 400)))[0] == pytest.approx(auc(labels, scores))
    assert weighted_logloss(labels, scores, np.ones((1, 400)))[0] == pytest.approx(
        logloss(labels, sigmoid(scores))
    )


def test_identical_models_give_a_zero_interval() -> None:
    values = np.random.default_rng(1).random(200)
    interval = paired_user_metric(values, values)
    assert (interval.relative, interval.low, interval.high) == (0.0, 0.0, 0.0)


def test_a_clearly_worse_candidate_has_an_interval_below_zero() -> None:
    rng = np.random.default_rng(2)
    production = rng.random(300)
    candidate = production * 0.8 + rng.normal(0, 0.01, 300)
    interval = paired_user_metric(candidate, production, resamples=500, seed=3)
    assert interval.high < 0 and interval.low < -0.15
    assert interval == paired_user_metric(candidate, production, resamples=500, seed=3)


def test_equal_but_noisy_models_have_an_interval_around_zero() -> None:
    rng = np.random.default_rng(4)
    production = rng.random(300)
    candidate = production + rng.normal(0, 0.2, 300)
    interval = paired_user_metric(candidate, production)
    assert interval.low < 0 < interval.high


def test_logloss_difference_is_positive_when_the_candidate_is_better() -> None:
    rng = np.random.default_rng(5)
    labels = (rng.random(2000) < 0.4).astype(float)
    good = (labels - 0.5) * 4 + rng.normal(0, 1, 2000)
    users = rng.integers(0, 100, 2000)
    interval = paired_ranking_metric("logloss", labels, good, good * 0.2, users, resamples=200)
    assert interval.relative > 0 and interval.low > 0
    auc_interval = paired_ranking_metric("auc", labels, -good, good, users, resamples=200)
    assert auc_interval.high < 0


def test_relative_difference_with_a_zero_production() -> None:
    assert relative_difference(np.array(0.1), np.array(0.0), False) == np.inf
    assert relative_difference(np.array(0.0), np.array(0.0), False) == 0.0
    assert relative_difference(np.array(0.5), np.array(0.4), True) == pytest.approx(-0.25)
