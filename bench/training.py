"""Benchmark: end-to-end training throughput of DLRM and the two-tower, as the seeds measure it.

On the synthetic generator (prepared by the project's own ETL), for each model, in one run:

  (a) full    the training step fed by the project's loader (DLRM: ParquetBatchLoader over
              the ranking parquet; two-tower: TwoTowerBatches over retrieval.npz), through
              ``prefetched`` as in ``train_epochs`` (on a GPU: built ahead by a thread)
  (b) compute the same step on batches already in memory (loader cost excluded)
  (c) loader  the project's loader alone, no model
  (d) naive   a textbook PyTorch pipeline: a map-style Dataset returning one row per
              ``__getitem__`` and a DataLoader collating them, training the same model
  (e) naive loader  that textbook DataLoader alone, no model

Samples/s of each, the ratios (a)/(b) (target >= 0.9: the loader is not the bottleneck) and
(a)/(d) (target >= 10), and the peak resident memory. (d) runs the same step as (a) after a
slower loader, so (a)/(d) is about ``1 + (b)/(e)`` (the textbook loader's time added to the
same step, when (a) runs at (b)): 10x needs the model's step alone to run at least 9x faster
than the textbook loader alone. The JSON's ``full_over_naive_expected`` is that estimate for
this machine and model.

The models train where ``cascade train`` puts them (``--device``, default the GPU when there
is one): batches are built on the CPU and moved to the model, and on a GPU the forward pass
runs under bfloat16 autocast, exactly as in ``train_epochs``. (a), (b), (c) run for up to
``--seconds`` each; (d) and (e), much slower, for up to ``--naive-seconds``. Prints a table,
then one JSON object as its last line (also written to ``bench/results/training.json``).

    python bench/training.py            # 200k users x 1M items x 10M interactions
    python bench/training.py --quick    # 5k users x 20k items x 300k interactions
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from publish import publish
from torch.utils.data import DataLoader, Dataset

from core.features.workflow import Workflow
from pipelines.config import TrainConfig
from pipelines.data.synthetic import make_synthetic
from pipelines.dataloader import ParquetBatchLoader
from pipelines.models.dlrm import DLRM
from pipelines.prepare import RetrievalData, prepare
from pipelines.training.loop import device, make_step, prefetched
from pipelines.training.ranking import build_dlrm, ranking_groups, ranking_inputs
from pipelines.training.retrieval import TwoTowerBatches, build_two_tower

Step = Callable[[Any], Any]


WARMUP_BATCHES = 3
REPEATS = 2  # each figure is the best of this many timed windows (shared, busy machines)


def _synchronize() -> None:
    """Wait for the GPU's queued work, so that a timed run ends when its steps have run."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Phase:
    """One of (a)-(e): ``step`` run on each of ``batches`` (None: the loader alone), timed
    in windows of ``seconds``; ``best`` is the highest samples/s of its windows."""

    def __init__(
        self,
        batches: Iterable[Any],
        rows_of: Callable[[Any], int],
        step: Step | None,
        seconds: float,
    ) -> None:
        self.iterator = iter(batches)
        self.rows_of, self.step, self.seconds = rows_of, step, seconds
        self.best = 0.0

    def warm(self) -> None:
        """Run the first ``WARMUP_BATCHES``, untimed."""
        for batch, _ in zip(self.iterator, range(WARMUP_BATCHES), strict=False):
            if self.step is not None:
                self.step(batch)

    def window(self) -> None:
        _synchronize()
        rows, started = 0, time.perf_counter()
        for batch in self.iterator:
            if self.step is not None:
                self.step(batch)
            rows += self.rows_of(batch)
            if time.perf_counter() - started > self.seconds:
                break
        _synchronize()
        self.best = max(self.best, rows / (time.perf_counter() - started))


def _measure(
    project: Callable[[], Iterable[Any]],
    resident: list[Any],
    textbook: Iterable[Any],
    rows_of: Callable[[Any], int],
    new_step: Callable[[], Step],
    seconds: float,
    naive_s: float,
    where: torch.device,
) -> dict:
    """(a)-(e) of one model: ``project()`` an epoch of the project's loader (called again
    when one ends; (a) and (c) each iterate their own), ``resident`` batches in memory,
    ``textbook`` the item-by-item DataLoader; ``new_step()`` a fresh model's step for each
    phase that trains.

    Each phase's figure is its best samples/s over ``REPEATS`` windows, the phases taking
    turns (a, b, ..., a, b, ...): on a shared machine a slow minute then costs every phase
    one window, not one phase all of its windows (in consecutive windows, (a)/(b) of the
    same step moved between 0.85 and 1.02 from run to run)."""
    phases = [
        Phase(prefetched(_cycle(project), where), rows_of, new_step(), seconds),
        Phase(_cycle(lambda: resident), rows_of, new_step(), seconds),
        Phase(_cycle(project), rows_of, None, seconds),
        Phase(_cycle(lambda: textbook), rows_of, new_step(), naive_s),
        Phase(_cycle(lambda: textbook), rows_of, None, naive_s),
    ]
    for phase in phases:
        phase.warm()
    for _ in range(REPEATS):
        for phase in phases:
            phase.window()
    return _rates(*(phase.best for phase in phases))


def _cycle(make: Callable[[], Iterable[Any]]) -> Iterator[Any]:
    while True:
        yield from make()


# ----- DLRM ---------------------------------------------------------------------------------


class DLRMRows(Dataset):
    """One ranking row per ``__getitem__`` (the textbook pipeline)."""

    def __init__(self, inputs: dict[str, np.ndarray]) -> None:
        self.inputs = inputs

    def __len__(self) -> int:
        return len(self.inputs["label"])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {
            "sparse": torch.from_numpy(self.inputs["sparse"][i]),
            "dense": torch.from_numpy(self.inputs["dense"][i]),
            "label": torch.tensor([self.inputs["label"][i]]),
        }


def bench_dlrm(
    workdir: Path, config: TrainConfig, seconds: float, naive_s: float, where: torch.device
) -> dict:
    workflow = Workflow.load(workdir / "workflow")
    train = ranking_inputs(workdir / "ranking_train.parquet", workflow.schema)
    n_dense = train["dense"].shape[1]

    def model_and_step() -> tuple[DLRM, Step]:
        torch.manual_seed(config.seed)
        model = build_dlrm(workflow, n_dense, config).to(where)
        model.train()

        def loss(batch: dict[str, torch.Tensor]) -> torch.Tensor:
            logits = model(batch["sparse"], batch["dense"].contiguous())
            return F.binary_cross_entropy_with_logits(logits.float(), batch["label"][:, 0])

        return model, make_step(model, loss, config.dlrm_lr)

    def loader() -> ParquetBatchLoader:
        return ParquetBatchLoader(
            [workdir / "ranking_train.parquet"],
            ranking_groups(workflow.schema),
            config.dlrm_batch,
            dtypes={"sparse": torch.int64},
            seed=config.seed,
        )

    def rows_of(batch: dict[str, torch.Tensor]) -> int:
        return len(batch["label"])

    batch_loader = loader()
    resident = [
        {k: v.clone() for k, v in b.items()} for b, _ in zip(loader(), range(256), strict=False)
    ]
    naive_loader = DataLoader(DLRMRows(train), batch_size=config.dlrm_batch, shuffle=True)
    rates = _measure(
        lambda: batch_loader,
        resident,
        naive_loader,
        rows_of,
        lambda: model_and_step()[1],
        seconds,
        naive_s,
        where,
    )
    return {"rows": len(train["label"]), **rates}


# ----- two-tower ----------------------------------------------------------------------------


class TwoTowerPairs(Dataset):
    """One (user, positive) pair per ``__getitem__``, with the same inputs as TwoTowerBatches."""

    def __init__(self, data: RetrievalData) -> None:
        self.data = data
        self.item_idx = data.item_features[:, 0]

    def __len__(self) -> int:
        return len(self.data.positives["train"])

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        user, item = (int(x) for x in self.data.positives["train"][i])
        recent = self.data.history[user].copy()
        recent[recent == self.item_idx[item]] = 0
        return (
            torch.from_numpy(self.data.user_features[user]),
            torch.from_numpy(recent),
            torch.from_numpy(self.data.item_features[item]),
            torch.from_numpy(self.data.item_dense[item]),
            torch.tensor(item),
            torch.tensor(self.data.item_log_q[item]),
        )


def bench_two_tower(
    workdir: Path, config: TrainConfig, seconds: float, naive_s: float, where: torch.device
) -> dict:
    workflow = Workflow.load(workdir / "workflow")
    data = RetrievalData.load(workdir / "retrieval.npz")

    def model_and_step() -> Step:
        torch.manual_seed(config.seed)
        model = build_two_tower(workflow, data.item_dense.shape[1], config).to(where)
        model.train()
        return make_step(model, lambda batch: model.loss(*batch), config.two_tower_lr)

    def rows_of(batch: tuple[torch.Tensor, ...]) -> int:
        return len(batch[0])

    batches = TwoTowerBatches(data, config.two_tower_batch, config.seed)
    resident = [b for b, _ in zip(batches.epoch(1), range(256), strict=False)]
    naive_loader = DataLoader(
        TwoTowerPairs(data), batch_size=config.two_tower_batch, shuffle=True, drop_last=True
    )
    rates = _measure(
        lambda: batches.epoch(0),
        resident,
        naive_loader,
        rows_of,
        model_and_step,
        seconds,
        naive_s,
        where,
    )
    return {"rows": len(data.positives["train"]), **rates}


def _rates(full: float, compute: float, loading: float, naive: float, naive_loading: float) -> dict:
    return {
        "full_samples_per_s": round(full),
        "compute_only_samples_per_s": round(compute),
        "loader_only_samples_per_s": round(loading),
        "naive_samples_per_s": round(naive),
        "naive_loader_only_samples_per_s": round(naive_loading),
        "full_over_compute": round(full / compute, 3),
        "full_over_naive": round(full / naive, 1),
        "full_over_naive_expected": round(1 + compute / naive_loading, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--users", type=int, default=200_000)
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--interactions", type=int, default=10_000_000)
    parser.add_argument("--quick", action="store_true", help="5k x 20k x 300k, short phases")
    parser.add_argument("--seconds", type=float, default=30.0, help="budget of (a), (b), (c)")
    parser.add_argument("--naive-seconds", type=float, default=30.0, help="budget of (d) and (e)")
    parser.add_argument(
        "--threads", type=int, default=TrainConfig().torch_threads, help="torch threads"
    )
    defaults = TrainConfig()
    parser.add_argument(
        "--dlrm-batch", type=int, default=defaults.dlrm_batch, help="DLRM batch size (all phases)"
    )
    parser.add_argument(
        "--two-tower-batch",
        type=int,
        default=defaults.two_tower_batch,
        help="two-tower batch size (all phases)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=device().type,
        help="where the models train (default: %(default)s, the GPU when there is one)",
    )
    args = parser.parse_args()
    if args.quick:
        args.users, args.items, args.interactions = 5_000, 20_000, 300_000
        args.seconds, args.naive_seconds = 5.0, 5.0
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    where = torch.device(args.device)
    torch.set_num_threads(args.threads)
    config = TrainConfig(
        torch_threads=args.threads,
        dlrm_batch=args.dlrm_batch,
        two_tower_batch=args.two_tower_batch,
    )

    with tempfile.TemporaryDirectory() as directory:
        workdir = Path(directory)
        started = time.perf_counter()
        raw = make_synthetic(args.users, args.items, args.interactions, seed=0)
        prepare(raw, workdir, seed=0, history_length=config.history_length)
        del raw
        prepare_s = time.perf_counter() - started
        results = {
            "dlrm": bench_dlrm(workdir, config, args.seconds, args.naive_seconds, where),
            "two_tower": bench_two_tower(workdir, config, args.seconds, args.naive_seconds, where),
        }
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for name, r in results.items():
        print(
            f"{name:<9} full {r['full_samples_per_s']:>10,} /s  compute-only "
            f"{r['compute_only_samples_per_s']:>10,} /s  loader-only "
            f"{r['loader_only_samples_per_s']:>11,} /s  naive {r['naive_samples_per_s']:>8,} /s"
            f"  (a)/(b)={r['full_over_compute']}  (a)/(d)={r['full_over_naive']}x"
        )
        print(
            f"{'':<9} naive loader alone {r['naive_loader_only_samples_per_s']:>8,} /s: "
            f"(a)/(d) ~ 1 + (b)/(e) = {r['full_over_naive_expected']}x: 10x needs (b) >= 9 (e)"
        )
    record = {
        "benchmark": "training",
        "size": {"users": args.users, "items": args.items, "interactions": args.interactions},
        "prepare_seconds": round(prepare_s, 1),
        "threads": args.threads,
        "device": torch.cuda.get_device_name() if where.type == "cuda" else "cpu",
        "batch": {"dlrm": config.dlrm_batch, "two_tower": config.two_tower_batch},
        **results,
        "peak_rss_mb": round(peak_mb),
    }
    publish("training", record)


if __name__ == "__main__":
    main()
