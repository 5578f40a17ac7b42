"""TorchRec-sharded DLRM against the unsharded model, on 2 real ranks (torchrun, gloo).

One launch of ``sharded_dlrm_ranks.py`` runs two plans: the planner's own choice on the CPU
and every table forced column-wise (each split over both ranks). For each: the same weights
give the same logits; the state gathered back is the plain DLRM's, bit for bit; one step on
a global batch moves exactly the rows the batch touched, by what the unsharded step moves
them (Adagrad on the tables, Adam on the dense layers).

Tolerances: logits 1e-6 (float32 sums in another order); after one step 1e-6 on the tables
and 1e-5 on the dense layers (Adam's first step divides by the gradient's magnitude, so a
gradient near zero magnifies rounding differences).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("torchrec")

from pipelines.models.dlrm import DLRM
from services.util.local_redis import free_port
from tests.integration.sharded_dlrm_ranks import CARDINALITIES, DIM, N_DENSE

WORKER = Path(__file__).with_name("sharded_dlrm_ranks.py")
CPU_TYPES = {"table_wise", "column_wise"}


def two_ranks(worker: Path, *args: str) -> None:
    """Run ``worker`` on 2 ranks under torchrun (gloo, loopback); fail with its stderr."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    command += ["--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    done = subprocess.run(
        [*command, str(worker), *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("sharded")
    two_ranks(WORKER, str(out))
    return torch.load(out / "results.pt", weights_only=False)


@pytest.fixture(params=["planned", "column_wise"])
def case(request: pytest.FixtureRequest, cases: dict[str, Any]) -> dict[str, Any]:
    return cases[request.param]


def test_the_planner_places_tables_table_or_column_wise_on_the_cpu(
    cases: dict[str, Any],
) -> None:
    planned = cases["planned"]["placement"]
    assert cases["planned"]["world"] == 2
    assert set(planned) == {f"table_{j}" for j in range(len(CARDINALITIES))}
    assert {kind for kind, _ in planned.values()} <= CPU_TYPES
    # the tables are spread: each rank holds a shard of some table, and the ranks' order is
    # not the tables' (what the forward pass must undo, checked by the tests below)
    first_holder = [planned[f"table_{j}"][1][0] for j in range(len(CARDINALITIES))]
    assert set(first_holder) == {0, 1}
    assert first_holder != sorted(first_holder)
    forced = cases["column_wise"]["placement"]
    assert all(kind == "column_wise" and holders == [0, 1] for kind, holders in forced.values())


def test_same_weights_give_the_same_logits(case: dict[str, Any]) -> None:
    assert case["sharded_logits"].shape == (301,)
    np.testing.assert_allclose(case["sharded_logits"], case["plain_logits"], rtol=0, atol=1e-6)


def test_the_gathered_state_is_the_plain_dlrms(case: dict[str, Any]) -> None:
    gathered, initial = case["gathered"], case["initial"]
    assert set(gathered) == set(initial)
    DLRM(CARDINALITIES, N_DENSE, dim=DIM).load_state_dict(gathered)  # strict: same keys, shapes
    for key, value in initial.items():
        assert torch.equal(gathered[key], value), key


def test_one_step_moves_the_rows_the_batch_touched_as_unsharded(case: dict[str, Any]) -> None:
    initial, stepped, reference = case["initial"], case["stepped"], case["reference_stepped"]
    for column in range(len(CARDINALITIES)):
        key = f"tables.{column}.weight"
        touched = torch.unique(case["batch_sparse"][:, column])
        for after in (stepped[key], reference[key]):
            moved = torch.nonzero((after != initial[key]).any(dim=1)).flatten()
            assert torch.equal(moved, touched), key
        torch.testing.assert_close(stepped[key], reference[key], rtol=0, atol=1e-6)
    dense = [key for key in initial if key.startswith("dense_part.")]
    assert dense
    for key in dense:
        assert not torch.equal(stepped[key], initial[key]), key
        torch.testing.assert_close(stepped[key], reference[key], rtol=0, atol=1e-5)
