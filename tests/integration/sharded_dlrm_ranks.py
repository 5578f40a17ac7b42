"""One rank of the sharded-DLRM checks, run under ``torchrun`` by ``test_sharded_dlrm.py``.

Every rank builds the same DLRM (same seed), shards it, scores a batch, gathers the state
back, and takes one training step on a global batch. Rank 0 also runs the unsharded model on
the same weights and batch, and writes everything the test compares to ``<out>/results.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from pipelines.models.dlrm import DLRM
from pipelines.training.loop import seed_everything
from pipelines.training.sharded import (
    SPARSE_EPS,
    gather_dlrm_state,
    make_sharded_step,
    process_group,
    scatter_rows,
    shard_dlrm,
    sharded_logits,
)

COLUMN_WISE = "column_wise"
# ten tables, small and large: the planner spreads them and places some later table on a
# lower rank than an earlier one (the sharded output's order is then not the features')
CARDINALITIES = [300, 400, 3, 7, 21, 100, 80, 19, 24, 7]
N_DENSE, DIM, BATCH, LR = 5, 16, 64, 0.05


def batch(seed: int, rows: int) -> dict[str, torch.Tensor]:
    """Ids drawn from few rows of each table, so most rows stay untouched by a step."""
    rng = np.random.default_rng(seed)
    sparse = np.stack([rng.integers(0, min(n, 12), rows) for n in CARDINALITIES], axis=1)
    return {
        "sparse": torch.from_numpy(sparse.astype(np.int64)),
        "dense": torch.from_numpy(rng.normal(size=(rows, N_DENSE)).astype(np.float32)),
        "label": torch.from_numpy(rng.integers(0, 2, (rows, 1)).astype(np.float32)),
    }


def reference_step(model: DLRM, data: dict[str, torch.Tensor]) -> None:
    """The unsharded step the sharded one must equal: the global batch's mean loss, Adagrad
    on the tables, Adam on the rest."""
    tables = model.table_weights()
    table_ids = {id(t) for t in tables}
    dense = [p for p in model.parameters() if id(p) not in table_ids]
    sparse_opt = torch.optim.Adagrad(tables, lr=LR, eps=SPARSE_EPS)
    dense_opt = torch.optim.Adam(dense, lr=LR, fused=True)
    model.train()
    loss = F.binary_cross_entropy_with_logits(
        model(data["sparse"], data["dense"]), data["label"][:, 0]
    )
    loss.backward()
    sparse_opt.step()
    dense_opt.step()


def run_case(allowed: list[str] | None) -> dict[str, Any] | None:
    """Shard, score, gather, step; on rank 0 the results and the unsharded reference's."""
    with process_group() as ranks:
        seed_everything(0)
        model = DLRM(CARDINALITIES, N_DENSE, dim=DIM)
        initial = {k: v.clone() for k, v in model.state_dict().items()}
        sharded = shard_dlrm(model, LR, ranks, allowed)
        placement = {  # table -> (sharding type, ranks holding a shard)
            name: (spec.sharding_type, sorted({p.rank() for p in _placements(spec)}))
            for name, spec in sharded.plan.plan["ebc"].items()  # type: ignore[union-attr]
        }
        scored = batch(1, 301)  # not a multiple of the world size
        rows = {k: v.numpy() for k, v in scored.items()} if ranks.rank == 0 else None
        logits = sharded_logits(sharded, *scatter_rows(rows, ranks), ranks)  # rank 0's rows
        gathered = gather_dlrm_state(sharded)
        trained = batch(2, BATCH)
        loss = make_sharded_step(sharded, LR, ranks)(trained)
        assert loss is not None
        stepped = gather_dlrm_state(sharded)
        if ranks.rank != 0:
            return None
        reference = DLRM(CARDINALITIES, N_DENSE, dim=DIM)
        reference.load_state_dict(initial)
        reference.eval()
        with torch.no_grad():
            plain_logits = reference(scored["sparse"], scored["dense"]).numpy()
        reference_step(reference, trained)
        return {
            "world": ranks.world,
            "placement": placement,
            "initial": initial,
            "gathered": gathered,
            "sharded_logits": logits,
            "plain_logits": plain_logits,
            "stepped": stepped,
            "reference_stepped": reference.state_dict(),
            "batch_sparse": trained["sparse"],
        }


def main(out: Path) -> None:
    """The planner's own choice, then every table forced column-wise (split over ranks)."""
    with process_group():  # one group for both cases (run_case joins it)
        cases = {"planned": run_case(None), "column_wise": run_case([COLUMN_WISE])}
    if cases["planned"] is not None:
        torch.save(cases, out / "results.pt")


def _placements(spec: object) -> list:
    return [shard.placement for shard in spec.sharding_spec.shards]  # type: ignore[attr-defined]


if __name__ == "__main__":
    main(Path(sys.argv[1]))
