"""``train_dlrm_sharded`` end to end on a prepared synthetic work directory: one process (a
group of one) against 2 ranks under ``torchrun`` (gloo), the same global batches and seed.

The maths is the same (each rank's loss is scaled so that the averaged gradients are the
global batch's), only float32 sums run in another order, so: the curves agree to 1e-5 (loss,
relative) and 1e-4 (validation AUC and LogLoss); the trained weights to 1e-3 after two
epochs of Adam at lr 0.05 (which magnifies rounding); the kept validation logits to 1e-4.
Either way the result is a plain DLRM state_dict (the one export format).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

pytest.importorskip("torchrec")

from cli.main import main
from core.features.workflow import Workflow
from pipelines.config import TrainConfig
from pipelines.training.ranking import build_dlrm, dlrm_logits, ranking_inputs
from tests.integration.sharded_training_ranks import main as train_alone
from tests.integration.test_sharded_dlrm import two_ranks

WORKER = Path(__file__).with_name("sharded_training_ranks.py")
DATA = ["--dataset", "synthetic", "--users", "200", "--items", "300", "--interactions", "8000"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("sharded_training")
    work = root / "work"
    with contextlib.redirect_stdout(io.StringIO()):
        steps = ["train", "prepare", "--workdir", str(work), "--output", str(root / "out")]
        assert main([*steps, *DATA]) == 0
    assert not dist.is_initialized()
    train_alone(work, root, 2)  # a group of one in this process (torchrec is imported already)
    two_ranks(WORKER, str(work), str(root))
    results = {w: torch.load(root / f"trained_{w}.pt", weights_only=False) for w in (1, 2)}
    return work, results


def test_two_ranks_train_as_one_process(runs: tuple[Path, dict[int, dict[str, Any]]]) -> None:
    _, results = runs
    one, two = results[1]["curve"], results[2]["curve"]
    assert [r["epoch"] for r in one] == [r["epoch"] for r in two] == [1, 2]
    for a, b in zip(one, two, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
        assert b["valid_auc"] == pytest.approx(a["valid_auc"], abs=1e-4)
        assert b["valid_logloss"] == pytest.approx(a["valid_logloss"], abs=1e-4)
        assert a.get("best") == b.get("best")
    assert sum(r.get("best", 0) for r in two) == 1
    for key, value in results[1]["state"].items():
        torch.testing.assert_close(results[2]["state"][key], value, rtol=0, atol=1e-3)
    np.testing.assert_allclose(results[2]["kept"], results[1]["kept"], rtol=0, atol=1e-4)


def test_rank_zero_holds_a_plain_dlrm_whose_logits_are_the_kept_ones(
    runs: tuple[Path, dict[int, dict[str, Any]]],
) -> None:
    work, results = runs
    workflow = Workflow.load(work / "workflow")
    valid = ranking_inputs(work / "ranking_valid.parquet", workflow.schema)
    model = build_dlrm(workflow, valid["dense"].shape[1], TrainConfig())
    for world, result in results.items():
        model.load_state_dict(result["state"])  # strict: the plain DLRM's keys and shapes
        kept = dlrm_logits(model, valid)
        np.testing.assert_allclose(result["kept"], kept, rtol=0, atol=1e-5, err_msg=str(world))


def test_one_line_per_epoch_from_rank_zero(runs: tuple[Path, dict[int, dict[str, Any]]]) -> None:
    _, results = runs
    lines = results[2]["lines"]
    assert len(lines) == 2
    assert all("valid_auc=" in line and "tables sharded over 2 ranks" in line for line in lines)
