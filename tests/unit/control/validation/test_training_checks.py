"""The gate sees the beats-popularity checks recorded at training."""

from __future__ import annotations

import json
from pathlib import Path

from control.validation.gate import training_checks
from pipelines.evaluation.popularity_check import popularity_check


def test_checks_come_from_the_manifest_first(tmp_path: Path) -> None:
    failed = popularity_check("two_tower", 0.1, "popularity", 0.2, "ndcg@10", allowed=True)
    (tmp_path / "retrieval_result.json").write_text(
        json.dumps({"popularity_check": {**failed, "passed": True}})
    )
    [check] = training_checks({"quality_checks": [failed]}, tmp_path)
    assert check.name == "training.two_tower_beats_popularity" and not check.passed
    assert (check.value, check.threshold) == (0.1, 0.2)
    assert "does NOT beat popularity" in check.detail and "(overridden)" in check.detail


def test_without_them_in_the_manifest_the_workdir_results_are_read(tmp_path: Path) -> None:
    ranker = popularity_check("ranker", 0.8, "popularity", 0.7, "auc", allowed=False)
    (tmp_path / "ranking_result.json").write_text(json.dumps({"popularity_check": ranker}))
    [check] = training_checks({}, tmp_path)
    assert check.name == "training.ranker_beats_popularity" and check.passed


def test_nothing_recorded_means_no_check(tmp_path: Path) -> None:
    assert training_checks({}, None) == []
    assert training_checks({}, tmp_path) == []
