"""Retrieval step: train the two-tower model and the BPR-MF baseline, evaluate both and the
popularity baseline with full ranking, and save the models and item embeddings."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipelines.config import TrainConfig
from pipelines.evaluation.metrics import retrieval_metrics
from pipelines.features.spec import ITEM_TOWER_COLUMNS, USER_TOWER_COLUMNS, cardinality
from pipelines.features.workflow import Workflow
from pipelines.models.bpr import BPRMF
from pipelines.models.two_tower import ItemTower, QueryTower, TwoTower
from pipelines.prepare import RetrievalData
from pipelines.training.loop import seed_everything, train_epochs


def build_two_tower(workflow: Workflow, n_item_dense: int, config: TrainConfig) -> TwoTower:
    query = QueryTower(
        [cardinality(workflow, c) for c in USER_TOWER_COLUMNS],
        n_items=cardinality(workflow, "item_id_idx"),
        out_dim=config.two_tower_dim,
    )
    item = ItemTower(
        [cardinality(workflow, c) for c in ITEM_TOWER_COLUMNS],
        n_item_dense,
        out_dim=config.two_tower_dim,
    )
    return TwoTower(query, item, temperature=config.temperature)


def _batches(n: int, size: int, generator: torch.Generator) -> list[torch.Tensor]:
    return list(torch.randperm(n, generator=generator).split(size))


@torch.no_grad()
def item_embeddings(model: TwoTower, data: RetrievalData) -> np.ndarray:
    model.eval()
    return model.item(
        torch.from_numpy(data.item_features), torch.from_numpy(data.item_dense)
    ).numpy()


@torch.no_grad()
def user_embeddings(model: TwoTower, data: RetrievalData, users: np.ndarray) -> np.ndarray:
    model.eval()
    return model.query(
        torch.from_numpy(data.user_features[users]), torch.from_numpy(data.history[users])
    ).numpy()


def train_two_tower(
    model: TwoTower,
    data: RetrievalData,
    config: TrainConfig,
    report: Callable[[str], None] | None = None,
) -> list[dict[str, float]]:
    pairs = torch.from_numpy(data.positives["train"])
    user_features, history = torch.from_numpy(data.user_features), torch.from_numpy(data.history)
    item_features, item_dense = (
        torch.from_numpy(data.item_features),
        torch.from_numpy(data.item_dense),
    )
    log_q = torch.from_numpy(data.item_log_q)
    item_idx = item_features[:, 0]
    generator = torch.Generator().manual_seed(config.seed)

    def loss(rows: torch.Tensor) -> torch.Tensor:
        model.train()
        users, items = pairs[rows, 0], pairs[rows, 1]
        recent = history[users]
        recent = recent.masked_fill(recent == item_idx[items][:, None], 0)  # never see the target
        return model.loss(
            user_features[users],
            recent,
            item_features[items],
            item_dense[items],
            items,
            log_q[items],
        )

    def validate(_: int) -> dict[str, float]:
        return {
            "valid_recall@20": evaluate_two_tower(model, data, "valid", config.eval_users)[
                "recall@20"
            ]
        }

    return train_epochs(
        model,
        lambda _: ((b,) for b in _batches(len(pairs), config.two_tower_batch, generator)),
        loss,
        config.two_tower_epochs,
        config.two_tower_lr,
        "two-tower",
        after_epoch=validate,
        keep_best="valid_recall@20",
        batches_per_epoch=-(-len(pairs) // config.two_tower_batch),
        report=report,
    )


def _seen(data: RetrievalData, split: str) -> np.ndarray:
    parts = ["train"] if split == "valid" else ["train", "valid"]
    return np.concatenate([data.positives[p] for p in parts])


def evaluate_two_tower(
    model: TwoTower, data: RetrievalData, split: str = "test", max_users: int | None = None
) -> dict[str, float]:
    items = item_embeddings(model, data)
    return retrieval_metrics(
        lambda users: user_embeddings(model, data, users) @ items.T,
        data.positives[split],
        _seen(data, split),
        len(data.user_ids),
        max_users=max_users,
    )


def train_bpr(
    data: RetrievalData, config: TrainConfig, report: Callable[[str], None] | None = None
) -> tuple[BPRMF, list[dict[str, float]]]:
    model = BPRMF(len(data.user_ids), len(data.item_ids))
    pairs = torch.from_numpy(data.positives["train"])
    generator = torch.Generator().manual_seed(config.seed)

    def loss(rows: torch.Tensor) -> torch.Tensor:
        negatives = torch.randint(0, len(data.item_ids), (len(rows),), generator=generator)
        return model.loss(pairs[rows, 0], pairs[rows, 1], negatives)

    curve = train_epochs(
        model,
        lambda _: ((b,) for b in _batches(len(pairs), 1024, generator)),
        loss,
        config.bpr_epochs,
        config.bpr_lr,
        "bpr-mf",
        batches_per_epoch=-(-len(pairs) // 1024),
        report=report,
    )
    return model, curve


@torch.no_grad()
def evaluate_bpr(
    model: BPRMF, data: RetrievalData, split: str = "test", max_users: int | None = None
) -> dict[str, float]:
    items = model.items.weight.numpy()
    return retrieval_metrics(
        lambda users: model.users.weight.numpy()[users] @ items.T,
        data.positives[split],
        _seen(data, split),
        len(data.user_ids),
        max_users=max_users,
    )


def popularity(data: RetrievalData) -> np.ndarray:
    """Training-positive counts per catalog item."""
    return np.bincount(data.positives["train"][:, 1], minlength=len(data.item_ids)).astype(
        np.float32
    )


def evaluate_popularity(
    data: RetrievalData, split: str = "test", max_users: int | None = None
) -> dict[str, float]:
    counts = popularity(data)
    return retrieval_metrics(
        lambda users: np.broadcast_to(counts, (len(users), len(counts))),
        data.positives[split],
        _seen(data, split),
        len(data.user_ids),
        max_users=max_users,
    )


def run_retrieval(
    workdir: Path, config: TrainConfig, report: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Train, evaluate and save; returns metrics and training curves (also saved as JSON).

    ``report`` gets one line per epoch (see ``train_epochs``)."""
    seed_everything(config.seed)
    torch.set_num_threads(config.threads)
    data = RetrievalData.load(workdir / "retrieval.npz")
    workflow = Workflow.load(workdir / "workflow")
    model = build_two_tower(workflow, data.item_dense.shape[1], config)
    two_tower_curve = train_two_tower(model, data, config, report)
    bpr, bpr_curve = train_bpr(data, config, report)
    result = {
        "metrics": {
            "two_tower": evaluate_two_tower(model, data, max_users=config.eval_users),
            "bpr_mf": evaluate_bpr(bpr, data, max_users=config.eval_users),
            "popularity": evaluate_popularity(data, max_users=config.eval_users),
        },
        "curves": {"two_tower": two_tower_curve, "bpr_mf": bpr_curve},
    }
    models = workdir / "models"
    models.mkdir(exist_ok=True)
    torch.save(model.state_dict(), models / "two_tower.pt")
    np.save(models / "item_embeddings.npy", item_embeddings(model, data))
    np.save(models / "popularity.npy", popularity(data))
    (workdir / "retrieval_result.json").write_text(json.dumps(result, indent=2))
    return result
