"""Benchmark: training past one process, by part. Each part runs alone and reports its own
figures; the last line is one JSON object with every part that ran.

  dp       data-parallel DLRM and two-tower steps (DistributedDataParallel, gloo) on the
           synthetic generator, prepared once by the project's ETL. Each model is trained
           three ways on the same global batches (``--dlrm-batch``, ``--two-tower-batch``):
             1 rank      one process, one torch thread
             1 rank x 2  one process, two torch threads (the other way to use 2 cores)
             2 ranks     torchrun, one thread each, each rank on its half of every batch
             2 ranks, dense grads   the same with every table's gradient dense (tables of
                         20k+ rows otherwise have sparse ones, all-reduced as sparse tensors)
           through the project's own path: ``distributed.lead_or_follow`` and
           ``run_on_all``, the loader's row shares (DLRM) or ``TwoTowerBatches``' batch
           shares (two-tower), ``train_epochs`` wrapping the model in DDP. Samples/s over
           ``--steps`` steps after ``--warmup``, the peak resident memory of every rank, and
           the scaling efficiency samples/s(2 ranks) / (2 x samples/s(1 rank)).
  sharded  TorchRec-sharded DLRM tables: bench/training_sharded.py, its last line
  dask     the feature workflow fitted on Dask workers: bench/feature_fit_distributed.py,
           its last line

A part whose script is not there is skipped with a note. ``--quick`` runs small sizes (and
passes ``--quick`` to the parts that take it).

    python bench/training_distributed.py                 # every part
    python bench/training_distributed.py --parts dp --quick
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from publish import publish

from core.features.workflow import Workflow
from pipelines.config import TrainConfig
from pipelines.dataloader import ParquetBatchLoader
from pipelines.models import embedding
from pipelines.models.two_tower import TwoTower
from pipelines.prepare import RetrievalData
from pipelines.training import distributed
from pipelines.training.loop import train_epochs
from pipelines.training.ranking import build_dlrm, dense_width, ranking_groups
from pipelines.training.retrieval import TwoTowerBatches, build_two_tower

BENCH = Path(__file__).resolve().parent
MODELS = ("dlrm", "two_tower")
# name -> (ranks, torch threads per rank, dense gradients for every table)
LAYOUTS = {
    "1_rank": (1, 1, False),
    "1_rank_2_threads": (1, 2, False),
    "2_ranks": (2, 1, False),
    "2_ranks_dense_grads": (2, 1, True),
}


# ----- dp: one rank's measured steps (run by every rank, through run_on_all) ---------------


class Timed:
    """``batches``, the clock started when the batch after the first ``warmup`` is drawn
    (the steps before it build the optimizer state and warm the allocator)."""

    def __init__(self, batches: Iterable[Any], warmup: int, steps: int) -> None:
        self.batches, self.warmup, self.steps = batches, warmup, steps
        self.started = self.ended = 0.0

    def __iter__(self) -> Iterator[Any]:
        for index, batch in enumerate(itertools.islice(self.batches, self.warmup + self.steps)):
            if index == self.warmup:
                self.started = time.perf_counter()
            yield batch
        self.ended = time.perf_counter()


def _dlrm(workdir: Path, config: TrainConfig) -> tuple[torch.nn.Module, Iterable[Any], Callable]:
    place = distributed.replicas()
    workflow = Workflow.load(workdir / "workflow")
    path = workdir / "ranking_train.parquet"
    model = build_dlrm(workflow, dense_width(path, workflow.schema), config)
    loader = ParquetBatchLoader(
        [path],
        ranking_groups(workflow.schema),
        place.share(config.dlrm_batch, "--dlrm-batch"),
        dtypes={"sparse": torch.int64},
        seed=config.seed,
        rank=place.rank,
        world=place.world,
    )

    def loss(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = model(batch["sparse"], batch["dense"].contiguous())
        return F.binary_cross_entropy_with_logits(logits.float(), batch["label"][:, 0])

    return model, ((b,) for b in loader), loss


def _two_tower(
    workdir: Path, config: TrainConfig
) -> tuple[torch.nn.Module, Iterable[Any], Callable]:
    place = distributed.replicas()
    data = RetrievalData.load(workdir / "retrieval.npz")
    model = build_two_tower(Workflow.load(workdir / "workflow"), data.item_dense.shape[1], config)
    batches = TwoTowerBatches(data, config.two_tower_batch, config.seed, replicas=place)
    gather = distributed.gather_rows if place.parallel else None

    assert isinstance(model, TwoTower)

    def loss(*batch: torch.Tensor) -> torch.Tensor:  # the in-batch softmax (a large catalog)
        users, history, items, dense, ids, log_q = batch
        return model.loss(users, history, items, dense, ids, log_q, gather, place.rank * len(ids))

    epochs = (batches.epoch(e) for e in itertools.count())
    return model, itertools.chain.from_iterable(epochs), loss


def peak_rss_mb() -> int:
    """This process's peak resident memory. ``VmHWM``, not ``ru_maxrss``: the latter keeps
    the high-water mark of the process that forked this one (the bench itself)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)  # not Linux


def measure(
    model_name: str, workdir: str, config: TrainConfig, steps: int, warmup: int, out: str
) -> None:
    """Train ``warmup + steps`` global steps of ``model_name`` on this rank's share; write
    ``out/rank<r>.json``: samples/s of the global batch, the peak resident memory."""
    place = distributed.replicas()
    torch.manual_seed(config.seed)
    model, batches, loss = (_dlrm if model_name == "dlrm" else _two_tower)(Path(workdir), config)
    model.train()
    timed = Timed(batches, warmup, steps)
    lr = config.dlrm_lr if model_name == "dlrm" else config.two_tower_lr
    train_epochs(model, lambda _: timed, loss, 1, lr, model_name, quiet=True, replicas=place)
    batch = config.dlrm_batch if model_name == "dlrm" else config.two_tower_batch
    seconds = timed.ended - timed.started
    record = {
        "rank": place.rank,
        "seconds": round(seconds, 2),
        "samples_per_s": round(steps * batch / seconds),
        "peak_rss_mb": peak_rss_mb(),
    }
    (Path(out) / f"rank{place.rank}.json").write_text(json.dumps(record))


def worker(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    if args.dense_grads:  # every table below the size that gets sparse gradients
        embedding.SPARSE_MIN_ROWS = sys.maxsize
    config = TrainConfig(
        torch_threads=args.threads, dlrm_batch=args.dlrm_batch, two_tower_batch=args.two_tower_batch
    )

    def lead() -> int:
        distributed.run_on_all(
            measure, args.model, args.workdir, config, args.steps, args.warmup, args.out
        )
        return 0

    return distributed.lead_or_follow(lead)


# ----- dp: orchestration ------------------------------------------------------------------


def run_layout(
    model: str, layout: tuple[int, int, bool], workdir: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """``model`` trained in its own process(es) laid out as ``layout``; rank 0's samples/s
    (DDP steps together) and every rank's peak resident memory."""
    ranks, threads, dense_grads = layout
    with tempfile.TemporaryDirectory() as out:
        role = [
            str(Path(__file__).resolve()),
            *("--role", "worker", "--model", model, "--workdir", str(workdir), "--out", out),
            *("--threads", str(threads), "--steps", str(args.steps), "--warmup", str(args.warmup)),
            *("--dlrm-batch", str(args.dlrm_batch), "--two-tower-batch", str(args.two_tower_batch)),
            *(["--dense-grads"] if dense_grads else []),
        ]
        launcher = [sys.executable]
        if ranks > 1:
            launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            launcher += ["--nproc_per_node", str(ranks)]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        done = subprocess.run([*launcher, *role], capture_output=True, text=True, env=env)
        if done.returncode:
            raise RuntimeError(f"{model} on {ranks} rank(s) failed:\n{done.stderr[-3000:]}")
        records = [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in range(ranks)]
    return {
        "samples_per_s": records[0]["samples_per_s"],
        "peak_rss_mb_per_rank": [r["peak_rss_mb"] for r in records],
    }


def part_dp(args: argparse.Namespace) -> dict[str, Any]:
    from pipelines.pipeline import run_pipeline  # the ETL's imports stay out of the workers

    size = (args.users, args.items, args.interactions)
    with tempfile.TemporaryDirectory() as directory:
        workdir = Path(directory)
        started = time.perf_counter()
        run_pipeline(
            workdir, workdir, TrainConfig(), ("prepare",), "synthetic", size, log=lambda _: None
        )
        print(f"dp: prepared {size} in {time.perf_counter() - started:.0f} s", flush=True)
        result: dict[str, Any] = {
            "users_items_interactions": list(size),
            "steps": args.steps,
            "repeats": args.repeats,
        }
        for model in MODELS:
            # the layouts take turns, so that a busy spell of the machine hits each alike
            tries: dict[str, list[dict[str, Any]]] = {name: [] for name in LAYOUTS}
            for _, (name, layout) in itertools.product(range(args.repeats), LAYOUTS.items()):
                tries[name].append(run_layout(model, layout, workdir, args))
                print(f"dp {model} {name}: {tries[name][-1]}", flush=True)
            runs: dict[str, Any] = {
                name: {  # the best try: the least disturbed by the machine's other work
                    "samples_per_s": max(t["samples_per_s"] for t in each),
                    "samples_per_s_tries": [t["samples_per_s"] for t in each],
                    "peak_rss_mb_per_rank": max(each, key=lambda t: t["samples_per_s"])[
                        "peak_rss_mb_per_rank"
                    ],
                }
                for name, each in tries.items()
            }
            one, two = runs["1_rank"]["samples_per_s"], runs["2_ranks"]["samples_per_s"]
            threads = runs["1_rank_2_threads"]["samples_per_s"]
            runs["scaling_efficiency_2"] = round(two / (2 * one), 3)
            runs["2_ranks_over_1_rank_2_threads"] = round(two / threads, 3)
            dense = runs["2_ranks_dense_grads"]["samples_per_s"]
            runs["2_ranks_sparse_over_dense_grads"] = round(two / dense, 3)
            result[model] = runs
    return result


# ----- the other parts: their own scripts, their last line ----------------------------------


def script_part(script: str) -> Callable[[argparse.Namespace], dict[str, Any]]:
    def run(args: argparse.Namespace) -> dict[str, Any]:
        path = BENCH / script
        if not path.is_file():
            return {"skipped": f"bench/{script} is not there"}
        command = [sys.executable, str(path), *(["--quick"] if args.quick else [])]
        done = subprocess.run(command, capture_output=True, text=True)
        lines = done.stdout.strip().splitlines()
        if done.returncode or not lines:
            return {"failed": f"bench/{script} exited {done.returncode}: {done.stderr[-500:]}"}
        return json.loads(lines[-1])

    return run


PARTS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "dp": part_dp,
    "sharded": script_part("training_sharded.py"),
    "dask": script_part("feature_fit_distributed.py"),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated parts")
    parser.add_argument("--quick", action="store_true", help="small sizes, few steps")
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--items", type=int, default=50_000)
    parser.add_argument("--interactions", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=200, help="measured steps of each run")
    parser.add_argument("--warmup", type=int, default=20, help="steps before the clock starts")
    parser.add_argument("--repeats", type=int, default=2, help="tries of each layout (best kept)")
    defaults = TrainConfig()
    parser.add_argument("--dlrm-batch", type=int, default=defaults.dlrm_batch)
    parser.add_argument("--two-tower-batch", type=int, default=defaults.two_tower_batch)
    parser.add_argument("--role", choices=["worker"], help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=MODELS, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--dense-grads", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "worker":
        sys.exit(worker(args))
    if args.quick:
        args.users, args.items, args.interactions, args.steps = 5_000, 25_000, 200_000, 60
    unknown = set(args.parts.split(",")) - set(PARTS)
    if unknown:
        parser.error(f"--parts: unknown {sorted(unknown)}; choose from {list(PARTS)}")
    record: dict[str, Any] = {"benchmark": "training_distributed", "cores": os.cpu_count()}
    for name in args.parts.split(","):
        started = time.perf_counter()
        record[name] = PARTS[name](args)
        record[name]["part_seconds"] = round(time.perf_counter() - started)
    publish("training_distributed", record)


if __name__ == "__main__":
    main()
