"""DLRM with its embedding tables sharded over ranks by TorchRec (model-parallel tables,
data-parallel dense layers).

``train_dlrm_sharded`` has ``train_dlrm``'s inputs and outputs: it takes a plain ``DLRM``,
trains a ``BagDLRM`` copy of it under ``DistributedModelParallel`` and leaves the trained
weights in the plain ``DLRM`` on rank 0, so that the release has one format whatever trained
it. A planner places each table: table-wise or column-wise on the CPU (gloo), row-wise on a
GPU. The tables' optimizer is Adagrad fused into the backward pass (FBGEMM's CPU kernels
have no Adam; element-wise, not row-wise, so that a column-wise shard steps as its whole
table would); the dense layers run under DDP with Adam, as in ``train_dlrm``.

Under ``torchrun`` every rank reads the same global batches (the loader's seed) and keeps its
slice of each, so N ranks step on exactly the batches one process would. Without a launcher
it runs as a group of one. TorchRec is imported only here (and by ``dlrm_sharded``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.types import ShardingPlan, ShardingType
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.optimizers import in_backward_optimizer_filter

from core.features.schema import FeatureSchema
from core.features.spec import WEIGHT
from pipelines.config import TrainConfig
from pipelines.dataloader import ParquetBatchLoader
from pipelines.evaluation.metrics import auc, logloss, sigmoid
from pipelines.models.dlrm import DLRM
from pipelines.models.dlrm_sharded import BagDLRM, table_name, to_bag_state, to_dlrm_state
from pipelines.training.ranking import split_groups

SPARSE_EPS = 1e-8  # the tables' Adagrad epsilon (FBGEMM's default too)
RESERVED_MEMORY = 0.15  # share of a rank's memory the planner leaves to all but the tables
SCORE_ROWS = 65_536  # rows per scoring forward pass: bounds the activations' memory


@dataclass(frozen=True)
class Ranks:
    """This process's place in the job."""

    rank: int
    world: int
    device: torch.device


def _device() -> torch.device:
    if torch.cuda.is_available():
        index = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


@contextmanager
def process_group() -> Iterator[Ranks]:
    """The job's process group: the launcher's (``torchrun`` sets ``WORLD_SIZE``), one that
    is already up, or else a group of one process. A group started here is ended here."""
    started = not dist.is_initialized()
    if started:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield Ranks(dist.get_rank(), dist.get_world_size(), _device())
        if started and dist.get_world_size() > 1:
            # no rank closes its connections while a peer's last exchange is in flight
            # (gloo aborts the other rank: "terminate called without an active exception")
            dist.barrier()
    finally:
        if started:
            dist.destroy_process_group()


def sharding_types(device: torch.device) -> list[str]:
    """What the planner may choose: table-wise or column-wise on the CPU (TorchRec's sharder
    offers row-wise only on CUDA), row-wise on a GPU (NCCL)."""
    if device.type == "cuda":
        return [ShardingType.ROW_WISE.value]
    return [ShardingType.TABLE_WISE.value, ShardingType.COLUMN_WISE.value]


def plan_sharding(
    model: BagDLRM,
    ranks: Ranks,
    sharders: list[EmbeddingBagCollectionSharder],
    allowed: list[str] | None = None,
) -> ShardingPlan:
    """The planner's placement of ``model``'s tables over the ranks (agreed by all ranks),
    among ``allowed`` sharding types (default: ``sharding_types`` of the device)."""
    n_tables = len(model.features)
    constraints = {
        table_name(j): ParameterConstraints(
            sharding_types=allowed or sharding_types(ranks.device),
            compute_kernels=[EmbeddingComputeKernel.FUSED.value],
            min_partition=max(4, model.dim // ranks.world),  # column shards: <= 1 per rank
        )
        for j in range(n_tables)
    }
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", ranks.world))
    memory: dict[str, int] = {}  # what a rank may hold: this host's, not the planner's default
    if ranks.device.type == "cuda":
        memory["hbm_cap"] = torch.cuda.get_device_properties(ranks.device).total_memory
    else:
        memory["ddr_cap"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // local_world
    topology = Topology(
        world_size=ranks.world,
        compute_device=ranks.device.type,
        local_world_size=local_world,
        **memory,
    )
    planner = EmbeddingShardingPlanner(
        topology=topology,
        constraints=constraints,
        # a fixed share kept for the dense layers, activations and buffers (TorchRec warns
        # that its default heuristic over-estimates them)
        storage_reservation=FixedPercentageStorageReservation(RESERVED_MEMORY),
    )
    group = dist.GroupMember.WORLD
    assert group is not None  # process_group() started it
    return planner.collective_plan(model, sharders, group)


def shard_dlrm(
    dlrm: DLRM, lr: float, ranks: Ranks, allowed: list[str] | None = None
) -> DistributedModelParallel:
    """``dlrm`` as a ``BagDLRM`` under ``DistributedModelParallel``, with its weights (taken
    from rank 0's ``dlrm`` for the dense layers, from each rank's for its own shards) and
    Adagrad fused into the tables' backward pass."""
    model = BagDLRM.from_dlrm(dlrm, device=torch.device("meta"))  # tables made by sharding
    apply_optimizer_in_backward(
        torch.optim.Adagrad, model.ebc.parameters(), {"lr": lr, "eps": SPARSE_EPS}
    )
    sharders = [EmbeddingBagCollectionSharder()]
    plan = plan_sharding(model, ranks, sharders, allowed)
    sharded = DistributedModelParallel(
        model,
        device=ranks.device,
        plan=plan,
        sharders=sharders,
    )
    load_dlrm_state(sharded, dlrm.state_dict())
    for name, value in sharded.state_dict().items():
        if not isinstance(value, ShardedTensor) and name.startswith("dense_part."):
            dist.broadcast(value, src=0)  # dense layers start equal on every rank
    return sharded


def load_dlrm_state(sharded: DistributedModelParallel, state: dict[str, torch.Tensor]) -> None:
    """Copy a plain ``DLRM`` state_dict (full tables) into ``sharded``: each rank copies the
    blocks of the tables it holds."""
    n_tables = len(sharded.module.features)
    source = to_bag_state(state, n_tables)
    with torch.no_grad():
        for key, target in sharded.state_dict().items():
            full = source[key]
            if isinstance(target, ShardedTensor):
                for shard in target.local_shards():
                    (row, col), (rows, cols) = (
                        shard.metadata.shard_offsets,
                        shard.metadata.shard_sizes,
                    )
                    shard.tensor.copy_(full[row : row + rows, col : col + cols])
            else:
                target.copy_(full)


def gather_dlrm_state(
    sharded: DistributedModelParallel, dst: int = 0
) -> dict[str, torch.Tensor] | None:
    """The plain ``DLRM`` state_dict (full tables, on the CPU) on rank ``dst``, None on the
    other ranks (every rank must call it: the tables are gathered)."""
    rank = dist.get_rank()
    full: dict[str, torch.Tensor] = {}
    for key, value in sharded.state_dict().items():
        if isinstance(value, ShardedTensor):
            shards = value.local_shards()
            where = shards[0].tensor.device if shards else _device()  # NCCL: on the GPU
            out = torch.empty(value.size(), dtype=value.dtype, device=where)
            value.gather(dst, out if rank == dst else None)
            full[key] = out.cpu()
        else:
            full[key] = value.detach().cpu().clone()
    if rank != dst:
        return None
    return to_dlrm_state(full, len(sharded.module.features))


def local_snapshot(sharded: DistributedModelParallel) -> dict[str, list[torch.Tensor]]:
    """A copy of this rank's part of the weights (its shards and the dense layers)."""
    return {
        key: [s.tensor.clone() for s in value.local_shards()]
        if isinstance(value, ShardedTensor)
        else [value.clone()]
        for key, value in sharded.state_dict().items()
    }


def restore_snapshot(
    sharded: DistributedModelParallel, snapshot: dict[str, list[torch.Tensor]]
) -> None:
    """Put back the weights ``local_snapshot`` copied."""
    with torch.no_grad():
        for key, value in sharded.state_dict().items():
            live = (
                [s.tensor for s in value.local_shards()]
                if isinstance(value, ShardedTensor)
                else [value]
            )
            for target, saved in zip(live, snapshot[key], strict=True):
                target.copy_(saved)


def share_bounds(n: int, world: int) -> np.ndarray:
    """Where each rank's contiguous share of ``n`` rows starts (and, last, where they end);
    shares differ by at most one row."""
    return np.linspace(0, n, world + 1).astype(np.int64)


def scatter_rows(
    inputs: dict[str, np.ndarray] | None, ranks: Ranks
) -> tuple[dict[str, np.ndarray], int]:
    """Rank 0's ``inputs`` cut into the ranks' contiguous shares: this rank's share and the
    number of rows in all (the other ranks pass None: only rank 0 reads the split)."""
    shares: list[tuple[dict[str, np.ndarray], int]] | None = None
    if ranks.rank == 0:
        if inputs is None:
            raise ValueError("rank 0 must pass the rows to score")
        n = len(inputs["sparse"])
        bounds = share_bounds(n, ranks.world)
        shares = [
            ({k: v[bounds[r] : bounds[r + 1]] for k, v in inputs.items()}, n)
            for r in range(ranks.world)
        ]
    if ranks.world == 1:
        assert shares is not None
        return shares[0]
    received: list[tuple[dict[str, np.ndarray], int] | None] = [None]
    dist.scatter_object_list(received, shares, src=0)
    share = received[0]
    assert share is not None
    return share


@torch.no_grad()
def sharded_logits(
    sharded: DistributedModelParallel, share: dict[str, np.ndarray], n: int, ranks: Ranks
) -> np.ndarray:
    """The logit of all ``n`` rows, on every rank, each rank scoring its ``share``
    (``scatter_rows``), padded to the largest share since every forward pass is collective."""
    sharded.eval()
    sizes = np.diff(share_bounds(n, ranks.world))
    largest = int(sizes.max())
    if largest == 0:
        return np.zeros(0, dtype=np.float32)
    padded = {  # zero rows (id 0 of every table) after this rank's share
        key: np.concatenate(
            [
                share[key],
                np.zeros((largest - len(share[key]), *share[key].shape[1:]), share[key].dtype),
            ]
        )
        for key in ("sparse", "dense")
    }
    logits = torch.empty(largest, dtype=torch.float32, device=ranks.device)
    for start in range(0, largest, SCORE_ROWS):
        sparse = torch.from_numpy(padded["sparse"][start : start + SCORE_ROWS])
        dense = torch.from_numpy(padded["dense"][start : start + SCORE_ROWS])
        logits[start : start + len(sparse)] = sharded(
            sparse.to(ranks.device), dense.to(ranks.device)
        ).float()
    gathered = [torch.empty_like(logits) for _ in range(ranks.world)]
    dist.all_gather(gathered, logits)
    parts = [part[: int(size)] for part, size in zip(gathered, sizes, strict=True)]
    return torch.cat(parts).cpu().numpy()


def dense_optimizer(sharded: DistributedModelParallel, lr: float) -> torch.optim.Optimizer:
    """Adam (fused, as ``train_dlrm``'s) on the parameters the tables' fused optimizer does
    not already update in the backward pass."""
    dense = [p for _, p in in_backward_optimizer_filter(sharded.named_parameters())]
    return torch.optim.Adam(dense, lr=lr, fused=True)


def make_sharded_step(
    sharded: DistributedModelParallel, lr: float, ranks: Ranks
) -> Callable[[dict[str, torch.Tensor]], torch.Tensor | None]:
    """One step on a global batch: this rank takes its share of the rows, and its loss is
    scaled so that the gradients (averaged over ranks by DDP and by TorchRec) are those of
    the global batch's mean loss. Returns this rank's part of that loss (None for a batch
    too small to give every rank a row: skipped by every rank alike)."""
    optimizer = dense_optimizer(sharded, lr)

    def step(batch: dict[str, torch.Tensor]) -> torch.Tensor | None:
        total = len(batch["label"])
        if total < ranks.world:
            return None
        bounds = share_bounds(total, ranks.world)
        rows = slice(int(bounds[ranks.rank]), int(bounds[ranks.rank + 1]))
        mine = {k: v[rows].to(ranks.device, non_blocking=True) for k, v in batch.items()}
        sharded.train()
        logits = sharded(mine["sparse"].contiguous(), mine["dense"].contiguous())
        weight = mine[WEIGHT][:, 0] if WEIGHT in mine else None
        part = (
            F.binary_cross_entropy_with_logits(
                logits.float(), mine["label"][:, 0], weight=weight, reduction="sum"
            )
            / total
        )
        optimizer.zero_grad(set_to_none=True)
        (part * ranks.world).backward()  # the tables' optimizer steps here, fused
        optimizer.step()
        return part.detach()

    return step


def train_dlrm_sharded(
    model: DLRM,
    schema: FeatureSchema,
    workdir: Path,
    valid: dict[str, np.ndarray] | None,
    config: TrainConfig,
    report: Callable[[str], None] | None = None,
) -> tuple[list[dict[str, float]], np.ndarray | None]:
    """``train_dlrm`` with the tables sharded, run on every rank: early stopping on
    validation AUC (keep-best, decided on rank 0), returning the curve and, on rank 0, the
    kept epoch's validation logits (the other ranks may pass no ``valid`` and get None).
    The trained weights land in ``model`` on rank 0 only (evaluation and export run there)."""
    train_path = workdir / "ranking_train.parquet"
    with process_group() as ranks:
        main = ranks.rank == 0
        emit = (report or print) if main else (lambda _: None)
        sharded = shard_dlrm(model, config.dlrm_lr, ranks)
        share, n_valid = scatter_rows(valid, ranks)
        loader = ParquetBatchLoader(
            [train_path],
            split_groups(train_path, schema),
            config.dlrm_batch,  # the global batch: each rank trains on its share of it
            dtypes={"sparse": torch.int64},
            seed=config.seed,
        )
        step = make_sharded_step(sharded, config.dlrm_lr, ranks)
        curve: list[dict[str, float]] = []
        best_auc, best_index, stale = -float("inf"), -1, 0
        best_logits: np.ndarray | None = None
        best_weights: dict[str, list[torch.Tensor]] | None = None
        for epoch in range(config.dlrm_epochs):
            started = time.perf_counter()
            running = torch.zeros((), device=ranks.device)
            count = 0
            for batch in loader:
                part = step(batch)
                if part is not None:
                    running += part
                    count += 1
            dist.all_reduce(running)  # the global batches' losses: the sum of the ranks' parts
            trained = time.perf_counter()
            logits = sharded_logits(sharded, share, n_valid, ranks)
            record: dict[str, float] = {"epoch": epoch + 1, "loss": float(running) / max(count, 1)}
            if main:
                assert valid is not None  # scatter_rows checked it
                record["valid_auc"] = auc(valid["label"], logits)
                record["valid_logloss"] = logloss(valid["label"], sigmoid(logits))
            decided = [record]
            dist.broadcast_object_list(decided, src=0)  # rank 0's metrics rule every rank
            record = decided[0]
            if record["valid_auc"] > best_auc:
                best_auc, best_index, stale = record["valid_auc"], epoch, 0
                best_logits = logits if main else None
                best_weights = local_snapshot(sharded)
            else:
                stale += 1
            curve.append(record)
            extras = " ".join(f"{k}={v:.4f}" for k, v in record.items() if k != "epoch")
            emit(
                f"dlrm epoch {epoch + 1}/{config.dlrm_epochs}: {extras} (trained in "
                f"{trained - started:.0f} s, validated in {time.perf_counter() - trained:.0f} s,"
                f" tables sharded over {ranks.world} ranks)"
            )
            if stale >= config.patience:
                emit(
                    f"dlrm: stopped early after epoch {epoch + 1} ({config.patience} "
                    "validations without a better valid_auc)"
                )
                break
        if best_weights is not None:
            restore_snapshot(sharded, best_weights)
            curve[best_index]["best"] = 1.0
        state = gather_dlrm_state(sharded)
    if state is not None:
        model.load_state_dict(state)
    model.cpu()
    if not main:
        return curve, None
    if best_logits is None:  # no epoch improved on -inf (an undefined AUC): the last weights
        return curve, logits
    return curve, best_logits
