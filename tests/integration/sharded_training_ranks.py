"""``train_dlrm_sharded`` on a prepared work directory, alone or as one rank of ``torchrun``;
rank 0 writes the curve, the kept validation logits and the trained plain DLRM's state.

    python sharded_training_ranks.py WORKDIR OUT [EPOCHS]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from core.features.workflow import Workflow
from pipelines.config import TrainConfig
from pipelines.training.loop import seed_everything
from pipelines.training.ranking import build_dlrm, ranking_inputs
from pipelines.training.sharded import process_group, train_dlrm_sharded


def main(workdir: Path, out: Path, epochs: int) -> None:
    config = TrainConfig(dlrm_epochs=epochs, dlrm_batch=256, dlrm_lr=0.05, torch_threads=1)
    with process_group() as ranks:
        seed_everything(config.seed)
        workflow = Workflow.load(workdir / "workflow")
        valid_path = workdir / "ranking_valid.parquet"
        valid = ranking_inputs(valid_path, workflow.schema) if ranks.rank == 0 else None
        dense = ranking_inputs(valid_path, workflow.schema)["dense"].shape[1]
        model = build_dlrm(workflow, dense, config)
        lines: list[str] = []
        schema = workflow.schema
        curve, kept = train_dlrm_sharded(model, schema, workdir, valid, config, lines.append)
        if ranks.rank != 0:
            assert kept is None and not lines
            return
        torch.save(
            {
                "world": ranks.world,
                "curve": curve,
                "kept": kept,
                "state": model.state_dict(),
                "lines": lines,
            },
            out / f"trained_{ranks.world}.pt",
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 2)
