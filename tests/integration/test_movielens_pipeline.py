"""The MovieLens-100K pipeline end to end through the CLI: the README's main job, shortened.

The README's command trains with the defaults (about 3 minutes on 2 cores, most of it the
two-tower's 20-30 epochs); here the same command with a few epochs and rounds, which must
already beat popularity widely. The defaults' figures: docs/benchmarks/cascade_train.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SHORTENED = ["--two-tower-epochs", "3", "--bpr-epochs", "5", "--dlrm-epochs", "2"]
SHORTENED += ["--gbm-rounds", "50"]


def test_movielens_pipeline_beats_popularity_on_every_metric(tmp_path: Path) -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.main",
            "train",
            "--workdir",
            str(tmp_path / "work"),
            "--output",
            str(tmp_path / "out"),
            *SHORTENED,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    report = json.loads(Path(completed.stdout.strip().splitlines()[-1]).read_text())
    lift = report["retrieval"]["two_tower_over_popularity"]
    assert set(lift) == {"recall@10", "ndcg@10", "recall@20", "ndcg@20"}
    assert min(lift.values()) > 1.5, lift  # "a wide margin"
    metrics = report["retrieval"]["metrics"]
    assert all(metrics["bpr_mf"][k] > metrics["popularity"][k] for k in lift)
    ranking = report["ranking"]["metrics"]
    assert ranking["blend"]["auc"] >= max(ranking["dlrm"]["auc"], ranking["gbm"]["auc"]) - 0.005
    assert all(m["auc"] > 0.75 for m in ranking.values())
