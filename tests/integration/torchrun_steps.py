"""Run by test_torchrun_gradients.py under torchrun: the same global batches trained
data-parallel (this rank's share, through DDP) and in one process (the whole batch).

Writes ``<out>/rank<r>.pt``: per model, the gradients of the first step both ways, and the
weights after a few steps of ``train_epochs`` both ways. Tables of 20k+ rows have sparse
gradients (LazyAdam), so both optimizers are in the comparison.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from pipelines.models.dlrm import DLRM
from pipelines.models.embedding import SPARSE_MIN_ROWS
from pipelines.models.two_tower import ItemTower, QueryTower, TwoTower
from pipelines.prepare import RetrievalData
from pipelines.training import distributed
from pipelines.training.distributed import Replicas
from pipelines.training.loop import train_epochs
from pipelines.training.retrieval import TwoTowerBatches

USERS, ITEMS, HISTORY = 200, SPARSE_MIN_ROWS + 500, 6
BATCH, STEPS, LR = 64, 6, 3e-3


def retrieval_data() -> RetrievalData:
    rng = np.random.default_rng(0)
    pairs = np.stack([rng.integers(0, USERS, 2_000), rng.integers(0, ITEMS, 2_000)], axis=1)
    item_idx = np.arange(ITEMS) + 1  # 0 is the padding id
    return RetrievalData(
        user_ids=np.arange(USERS),
        item_ids=np.arange(ITEMS),
        user_features=np.stack([np.arange(USERS) + 1, rng.integers(1, 5, USERS)], axis=1),
        history=rng.integers(0, ITEMS + 1, (USERS, HISTORY)),
        item_features=np.stack([item_idx, rng.integers(1, 9, ITEMS)], axis=1),
        item_dense=rng.normal(size=(ITEMS, 3)).astype(np.float32),
        item_log_q=np.log(rng.dirichlet(np.ones(ITEMS))).astype(np.float32),
        positives={"train": pairs, "valid": pairs[:0], "test": pairs[:0]},
    )


def two_tower() -> TwoTower:
    torch.manual_seed(0)
    query = QueryTower([USERS + 2, 6], ITEMS + 2, hidden=32, out_dim=16)
    item = ItemTower([ITEMS + 2, 10], 3, hidden=32, out_dim=16, bias=True)
    return TwoTower(query, item, temperature=0.2)


def dlrm() -> DLRM:
    torch.manual_seed(0)
    return DLRM([SPARSE_MIN_ROWS + 100, 50, 7], n_dense=5, dim=8)


def dlrm_batches(place: Replicas) -> list[tuple[torch.Tensor, ...]]:
    """``STEPS`` global batches, this rank's contiguous share of each."""
    generator = torch.Generator().manual_seed(1)
    size = BATCH // place.world
    mine = slice(place.rank * size, (place.rank + 1) * size)
    batches = []
    for _ in range(STEPS):
        sparse = torch.stack(
            [torch.randint(0, n, (BATCH,), generator=generator) for n in (SPARSE_MIN_ROWS, 50, 7)],
            dim=1,
        )
        dense = torch.randn(BATCH, 5, generator=generator)
        label = (torch.rand(BATCH, generator=generator) < 0.3).float()
        batches.append((sparse[mine], dense[mine], label[mine]))
    return batches


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        name: (p.grad.to_dense() if p.grad.is_sparse else p.grad).clone()
        for name, p in model.named_parameters()
        if p.grad is not None
    }


def compare(
    build: Callable[[], torch.nn.Module],
    batches: Callable[[Replicas], Iterable[tuple[Any, ...]]],
    loss: Callable[[torch.nn.Module, Replicas], Callable[..., torch.Tensor]],
    place: Replicas,
) -> dict[str, dict[str, torch.Tensor]]:
    """First-step gradients and weights after ``STEPS`` steps, data-parallel and alone."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for name, where in (("ddp", place), ("single", Replicas())):
        model = build()
        first = next(iter(batches(where)))
        objective = loss(model, where)
        step = distributed.data_parallel(model, objective) if where.parallel else objective
        step(*first).backward()
        out[f"{name}_grad"] = gradients(model)
        model = build()
        steps = list(batches(where))
        train_epochs(model, lambda _, s=steps: s, loss(model, where), 1, LR, name, replicas=where)
        out[f"{name}_weights"] = {k: v.clone() for k, v in model.state_dict().items()}
    return out


def main(out: Path) -> None:
    data = retrieval_data()

    def tower_batches(full: bool) -> Callable[[Replicas], Iterable[tuple[Any, ...]]]:
        def draw(where: Replicas) -> Iterable[tuple[Any, ...]]:
            made = TwoTowerBatches(data, BATCH, seed=2, full_softmax=full, replicas=where)
            return list(made.epoch(0))[:STEPS]

        return draw

    def sampled_loss(model: torch.nn.Module, where: Replicas) -> Callable[..., torch.Tensor]:
        gather = distributed.gather_rows if where.parallel else None

        def loss(*batch: torch.Tensor) -> torch.Tensor:
            return model.loss(*batch, gather=gather, offset=where.rank * len(batch[0]))  # type: ignore[operator]

        return loss

    def catalog_loss(model: torch.nn.Module, _: Replicas) -> Callable[..., torch.Tensor]:
        catalog = torch.from_numpy(data.item_features), torch.from_numpy(data.item_dense)
        return lambda *batch: model.catalog_loss(*batch, *catalog)  # type: ignore[operator]

    def bce(model: torch.nn.Module, _: Replicas) -> Callable[..., torch.Tensor]:
        return lambda sparse, dense, label: F.binary_cross_entropy_with_logits(
            model(sparse, dense), label
        )

    with distributed.session() as place:
        results = {
            "two_tower_sampled": compare(two_tower, tower_batches(False), sampled_loss, place),
            "two_tower_full": compare(two_tower, tower_batches(True), catalog_loss, place),
            "dlrm": compare(dlrm, dlrm_batches, bce, place),
        }
        torch.save(results, out / f"rank{place.rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
