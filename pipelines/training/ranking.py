"""Ranking step: train DLRM (through the parquet dataloader) and the tree ranker, fit their
blend weight on validation, and report AUC and LogLoss of each and of the blend on test."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F

from core.features.schema import FeatureSchema
from core.features.spec import DENSE, LABEL, WEIGHT, cardinality
from core.features.workflow import Workflow
from core.tree_ranker import TreeRanker, categorical_positions, tree_categorical, tree_features
from pipelines.config import TrainConfig
from pipelines.dataloader import ParquetBatchLoader
from pipelines.evaluation.metrics import auc, logloss, sigmoid
from pipelines.evaluation.popularity_check import describe, popularity_check
from pipelines.models.dlrm import DLRM
from pipelines.storage import column_names, read_columns
from pipelines.threads import all_cores
from pipelines.training import distributed
from pipelines.training.loop import (
    EarlyStopping,
    device,
    model_device,
    seed_everything,
    train_epochs,
)

ITEM_COUNT_AT = 1  # "item_id_idx_count" in every schema's dense inputs (schema.dense_inputs)


def ranking_groups(schema: FeatureSchema) -> dict[str, list[str]]:
    """The loader's groups of ``ranking_*.parquet`` columns: sparse ids, dense (the standardised
    columns, then the multi-hot blocks), label."""
    return {
        "sparse": list(schema.sparse_columns),
        "dense": [DENSE, *schema.multi_hot_columns],
        "label": [LABEL],
    }


def weighted(path: Path) -> bool:
    """Whether a ranking split carries row weights (a dataset file's event weights)."""
    return WEIGHT in pq.ParquetFile(path).schema_arrow.names


def split_groups(path: Path, schema: FeatureSchema) -> dict[str, list[str]]:
    """``ranking_groups`` of the split at ``path``, with its ``weight`` when it has one."""
    groups = ranking_groups(schema)
    if weighted(path):
        groups[WEIGHT] = [WEIGHT]
    return groups


def ranking_inputs(
    path: Path, schema: FeatureSchema, max_rows: int | None = None
) -> dict[str, np.ndarray]:
    """A whole split (or its first ``max_rows`` rows) as ``sparse [n, T]`` int64, ``dense
    [n, D]`` float32, ``label [n]`` and, when it has them, ``weight [n]``."""
    groups = split_groups(path, schema)
    names = {
        out: [c for g in group for c in column_names(path, g)] for out, group in groups.items()
    }
    columns = read_columns(path, [c for group in names.values() for c in group], max_rows)
    inputs: dict[str, np.ndarray] = {
        "sparse": np.stack([columns[c] for c in names["sparse"]], axis=1).astype(np.int64),
        "dense": np.stack([columns[c] for c in names["dense"]], axis=1).astype(np.float32),
        "label": columns[LABEL].astype(np.float32),
    }
    if WEIGHT in columns:
        inputs[WEIGHT] = columns[WEIGHT].astype(np.float32)
    return inputs


@torch.no_grad()
def dlrm_logits(model: DLRM, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """DLRM's logit of every row of a split (one large op: on every core)."""
    model.eval()
    where = model_device(model)
    sparse, dense = torch.from_numpy(inputs["sparse"]), torch.from_numpy(inputs["dense"])
    with all_cores():
        return model(sparse.to(where), dense.to(where)).float().cpu().numpy()


def build_dlrm(workflow: Workflow, n_dense: int, config: TrainConfig) -> DLRM:
    tables = [cardinality(workflow, c) for c in workflow.schema.sparse_columns]
    return DLRM(tables, n_dense, dim=config.dlrm_dim)


def dense_width(path: Path, schema: FeatureSchema) -> int:
    """The number of dense inputs (DLRM's bottom MLP's width) of the split at ``path``."""
    return sum(len(column_names(path, group)) for group in ranking_groups(schema)["dense"])


def train_dlrm(
    model: DLRM,
    schema: FeatureSchema,
    workdir: Path,
    valid: dict[str, np.ndarray] | None,
    config: TrainConfig,
    report: Callable[[str], None] | None = None,
) -> tuple[list[dict[str, float]], np.ndarray | None]:
    """Train with early stopping on validation AUC (keep-best); returns the curve and the
    kept epoch's validation logits (computed when it was validated, not a second time: at
    1M items a pass over the validation rows takes seconds).

    Data-parallel (inside ``distributed.run_on_all``): each rank reads its share of the
    training rows in batches of ``config.dlrm_batch / world``; rank 0 alone validates (the
    other ranks pass no ``valid`` and get no logits)."""
    train_path = workdir / "ranking_train.parquet"
    place = distributed.replicas()
    loader = ParquetBatchLoader(
        [train_path],
        split_groups(train_path, schema),
        place.share(config.dlrm_batch, "--dlrm-batch"),
        dtypes={"sparse": torch.int64},
        seed=config.seed,
        rank=place.rank,
        world=place.world,
    )

    def loss(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        model.train()
        logits = model(batch["sparse"], batch["dense"].contiguous())
        weight = batch[WEIGHT][:, 0] if WEIGHT in batch else None
        return F.binary_cross_entropy_with_logits(
            logits.float(), batch["label"][:, 0], weight=weight
        )

    validated: dict[int, np.ndarray] = {}  # epoch -> its validation logits

    def validate(epoch: int) -> dict[str, float]:
        assert valid is not None, "only rank 0 validates, with the validation split"
        logits = validated[epoch] = dlrm_logits(model, valid)
        return {
            "valid_auc": auc(valid["label"], logits),
            "valid_logloss": logloss(valid["label"], sigmoid(logits)),
        }

    model.to(device())  # the loader's batches are moved to it by train_epochs
    curve = train_epochs(
        model,
        lambda _: ((b,) for b in loader),
        loss,
        config.dlrm_epochs,
        config.dlrm_lr,
        "dlrm",
        stopping=EarlyStopping(validate, "valid_auc", config.patience),
        batches_per_epoch=len(loader),
        report=report,
        replicas=place,
    )
    model.cpu()  # evaluation, the blend and export run on the CPU
    kept = [index for index, record in enumerate(curve) if record.get("best")]
    if valid is None:
        return curve, None
    if not kept:  # no epoch improved on -inf (an undefined AUC): the last weights stay
        return curve, dlrm_logits(model, valid)
    return curve, validated[kept[0]]


def popularity_logits(inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The popularity ranker: the item's (standardised) training count as its score."""
    return inputs["dense"][:, ITEM_COUNT_AT].astype(np.float64)


def fit_blend_weight(labels: np.ndarray, dlrm: np.ndarray, tree: np.ndarray) -> float:
    """Weight w of ``w * dlrm + (1 - w) * tree`` logits with the lowest validation logloss."""
    grid = np.linspace(0.0, 1.0, 21)
    losses = [logloss(labels, sigmoid(w * dlrm + (1 - w) * tree)) for w in grid]
    return float(grid[int(np.argmin(losses))])


def _scores(labels: np.ndarray, logits: np.ndarray) -> dict[str, float]:
    return {"auc": auc(labels, logits), "logloss": logloss(labels, sigmoid(logits))}


def train_ranking_model(
    workdir: Path, config: TrainConfig, report: Callable[[str], None] | None = None
) -> tuple[Workflow, DLRM, list[dict[str, float]], dict[str, np.ndarray] | None, np.ndarray | None]:
    """The workflow, the trained DLRM and its curve, and (on rank 0) the validation split
    and its kept logits (``train_dlrm``), seeded."""
    seed_everything(config.seed)
    torch.set_num_threads(config.torch_threads)
    workflow = Workflow.load(workdir / "workflow")
    schema = workflow.schema
    main = distributed.replicas().main
    valid = ranking_inputs(workdir / "ranking_valid.parquet", schema) if main else None
    model = build_dlrm(workflow, dense_width(workdir / "ranking_train.parquet", schema), config)
    trainer = train_dlrm
    if config.sharded_embeddings:  # TorchRec is imported only when asked for
        from pipelines.training.sharded import train_dlrm_sharded as trainer
    curve, valid_logits = trainer(model, schema, workdir, valid, config, report)
    return workflow, model, curve, valid, valid_logits


def run_ranking(
    workdir: Path, config: TrainConfig, report: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Train, evaluate and save DLRM, the tree ranker and the blend weight (``report``: one
    line per DLRM epoch and one for the trees). Under a launcher (torchrun) DLRM trains on
    every rank (``train_ranking_model``), the rest on rank 0."""
    workflow, model, dlrm_curve, valid, valid_dlrm = distributed.run_on_all(
        train_ranking_model, workdir, config, report=report
    )
    assert valid is not None and valid_dlrm is not None  # rank 0's
    schema = workflow.schema
    test = ranking_inputs(workdir / "ranking_test.parquet", schema)

    # the training file's row groups are random samples: its first rows are one too
    train = ranking_inputs(workdir / "ranking_train.parquet", schema, config.gbm_max_rows)
    tree = TreeRanker()
    picked = categorical_positions(schema.sparse_columns, tree_categorical(workflow))
    train_x, categorical = tree_features(train, picked)
    valid_x, _ = tree_features(valid, picked)
    tree_curve = tree.fit(
        train_x,
        train["label"],
        valid_x,
        valid["label"],
        categorical,
        weight=train.get(WEIGHT),
        seed=config.seed,
        rounds=config.gbm_rounds,
        threads=config.threads,
    )
    (report or print)(
        f"gbm: {len(tree_curve['valid'])} rounds, valid_logloss={tree_curve['valid'][-1]:.4f}"
    )
    valid_tree = tree.logits(valid_x, config.threads)
    weight = fit_blend_weight(valid["label"], valid_dlrm, valid_tree)
    check = popularity_check(
        "ranker",
        auc(valid["label"], weight * valid_dlrm + (1 - weight) * valid_tree),
        "popularity",
        auc(valid["label"], popularity_logits(valid)),
        "auc",
        config.allow_below_popularity,
    )
    (report or print)(describe(check))

    test_dlrm = dlrm_logits(model, test)
    test_tree = tree.logits(tree_features(test, picked)[0], config.threads)
    result = {
        "metrics": {
            "dlrm": _scores(test["label"], test_dlrm),
            "gbm": _scores(test["label"], test_tree),
            "blend": _scores(test["label"], weight * test_dlrm + (1 - weight) * test_tree),
        },
        "blend_weight": weight,
        "popularity_check": check,
        "curves": {
            "dlrm": dlrm_curve,
            "gbm": [
                {"round": i + 1, "train_logloss": a, "valid_logloss": b}
                for i, (a, b) in enumerate(
                    zip(tree_curve["train"], tree_curve["valid"], strict=True)
                )
            ],
        },
    }
    models = workdir / "models"
    models.mkdir(exist_ok=True)
    torch.save(model.state_dict(), models / "dlrm.pt")
    tree.save(models / "gbm.txt")
    (workdir / "ranking_result.json").write_text(json.dumps(result, indent=2))
    return result
