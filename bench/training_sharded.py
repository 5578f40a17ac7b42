"""Benchmark: DLRM training steps with TorchRec-sharded tables against the unsharded DLRM.

Three runs of the same steps on the same global batches (DLRM-shaped, drawn in memory with
skewed ids: a few rows of each table are hot), each in its own process(es):

  unsharded   ``DLRM`` and ``make_step`` as ``train_dlrm`` runs them (Adam; LazyAdam on the
              tables of >= 20k rows), one process
  sharded_1   ``shard_dlrm`` + ``make_sharded_step`` as ``train_dlrm_sharded`` runs them
              (Adagrad fused into the tables' backward, Adam on the dense layers), a group
              of one process
  sharded_2   the same on 2 ranks under torchrun (gloo; the planner places the tables), each
              rank stepping on its half of every global batch

Each is run ``--rounds`` times, interleaved, and its fastest round kept (on a shared machine
the load changes from one minute to the next). Every process runs ``--threads`` torch
threads (default 1: on a loaded 2-core box, two OpenMP threads per process ran the steps
10-20x slower, spinning on a busy core).
Prints samples/s of each, sharded over unsharded, the 2-rank scaling efficiency
(sharded_2 / (2 x sharded_1)) and the peak resident memory of every process, then one JSON
object as its last line (also written to ``bench/results/training_sharded.json``). The
tables' optimizers differ (FBGEMM's CPU kernels have no Adam), so this measures the step's
cost, not the models' quality.

    python bench/training_sharded.py            # 8 tables, 1.26M rows, 300 steps, 3 rounds
    python bench/training_sharded.py --quick    # 6 tables, 126k rows, 60 steps

Also the ``sharded`` part of ``bench/training_distributed.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from publish import publish

from pipelines.models.dlrm import DLRM
from pipelines.training.loop import make_step, seed_everything
from services.util.local_redis import free_port

TABLES = [1_000_000, 200_000, 50_000, 10_000, 1_000, 100, 20, 7]
QUICK_TABLES = [100_000, 20_000, 5_000, 1_000, 100, 7]
N_DENSE, DIM, LR, WARMUP, POOL = 13, 16, 1e-3, 5, 32


def batches(tables: list[int], batch: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``POOL`` global batches, cycled by the runs (building them is not what is measured)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(POOL):
        skewed = rng.random((batch, len(tables))) ** 4  # most draws near row 0: hot rows
        sparse = (skewed * np.array(tables)).astype(np.int64)
        out.append(
            {
                "sparse": torch.from_numpy(sparse),
                "dense": torch.from_numpy(rng.normal(size=(batch, N_DENSE)).astype(np.float32)),
                "label": torch.from_numpy(rng.integers(0, 2, (batch, 1)).astype(np.float32)),
            }
        )
    return out


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_unsharded(tables: list[int], batch: int, steps: int) -> dict[str, Any]:
    seed_everything(0)
    model = DLRM(tables, N_DENSE, dim=DIM)
    step = make_step(
        model,
        lambda b: F.binary_cross_entropy_with_logits(
            model(b["sparse"], b["dense"]), b["label"][:, 0]
        ),
        LR,
    )
    data = batches(tables, batch)
    for i in range(WARMUP):
        step(data[i % POOL])
    started = time.perf_counter()
    for i in range(steps):
        step(data[i % POOL])
    seconds = time.perf_counter() - started
    return {"rank": 0, "samples_per_s": steps * batch / seconds, "peak_rss_mb": peak_rss_mb()}


def run_sharded(tables: list[int], batch: int, steps: int) -> dict[str, Any]:
    import torch.distributed as dist

    from pipelines.training.sharded import make_sharded_step, process_group, shard_dlrm

    with process_group() as ranks:
        seed_everything(0)
        model = DLRM(tables, N_DENSE, dim=DIM)
        sharded = shard_dlrm(model, LR, ranks)
        del model  # the trainer's caller keeps it; here only the shards and their state stay
        plan = {
            name: (
                spec.sharding_type,
                sorted({s.placement.rank() for s in spec.sharding_spec.shards}),
            )
            for name, spec in sharded.plan.plan["ebc"].items()
        }
        step = make_sharded_step(sharded, LR, ranks)
        data = batches(tables, batch)
        for i in range(WARMUP):
            step(data[i % POOL])
        dist.barrier()
        started = time.perf_counter()
        for i in range(steps):
            step(data[i % POOL])
        dist.barrier()
        seconds = time.perf_counter() - started
        return {
            "rank": ranks.rank,
            "world": ranks.world,
            "samples_per_s": steps * batch / seconds,  # global rows per second
            "peak_rss_mb": peak_rss_mb(),
            "plan": plan,
        }


def launch(role: str, ranks: int, threads: int, args: argparse.Namespace, out: Path) -> list[dict]:
    """Run one role in fresh processes (``ranks`` of them under torchrun); their records."""
    me = [str(Path(__file__).resolve()), "--role", role, "--out", str(out)]
    me += ["--steps", str(args.steps), "--batch", str(args.batch)] + (
        ["--quick"] if args.quick else []
    )
    if ranks == 1:
        command = [sys.executable, *me]
    else:
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
            "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *me,
        ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{role} on {ranks} rank(s) failed:\n{done.stderr[-3000:]}")
    return [json.loads(p.read_text()) for p in sorted(out.glob(f"{role}{ranks}_*.json"))]


def role_main(args: argparse.Namespace) -> None:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    tables = QUICK_TABLES if args.quick else TABLES
    run = run_unsharded if args.role == "unsharded" else run_sharded
    record = run(tables, args.batch, args.steps)
    world = record.get("world", 1)
    Path(args.out, f"{args.role}{world}_{record['rank']}.json").write_text(json.dumps(record))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller tables, fewer steps")
    parser.add_argument("--steps", type=int, help="measured steps per run (300; quick 60)")
    parser.add_argument("--batch", type=int, default=2048, help="global batch (default 2048)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads per process (default 1)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="runs of each, interleaved; the best is kept"
    )
    parser.add_argument("--role", choices=["unsharded", "sharded"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.steps = args.steps or (60 if args.quick else 300)
    if args.role:
        role_main(args)
        return
    runs: dict[str, list[list[dict]]] = {"unsharded": [], "sharded_1": [], "sharded_2": []}
    for _ in range(args.rounds):  # interleaved, so that a busy spell hits every run alike
        for name, role, ranks in (
            ("unsharded", "unsharded", 1),
            ("sharded_1", "sharded", 1),
            ("sharded_2", "sharded", 2),
        ):
            with tempfile.TemporaryDirectory() as tmp:
                runs[name].append(launch(role, ranks, args.threads, args, Path(tmp)))
    best = {name: max(rounds, key=lambda r: r[0]["samples_per_s"]) for name, rounds in runs.items()}
    unsharded, sharded_1, sharded_2 = best["unsharded"][0], best["sharded_1"][0], best["sharded_2"]
    rate = {
        "unsharded": unsharded["samples_per_s"],
        "sharded_1": sharded_1["samples_per_s"],
        "sharded_2": sharded_2[0]["samples_per_s"],
    }
    rss = {
        "unsharded": [round(unsharded["peak_rss_mb"])],
        "sharded_1": [round(sharded_1["peak_rss_mb"])],
        "sharded_2": [round(r["peak_rss_mb"]) for r in sharded_2],
    }
    for name, value in rate.items():
        print(f"{name:<10} {value:>10,.0f} samples/s   peak RSS per rank (MB) {rss[name]}")
    record = {
        "benchmark": "training_sharded",
        "tables": QUICK_TABLES if args.quick else TABLES,
        "dim": DIM,
        "batch": args.batch,
        "steps": args.steps,
        "threads": args.threads,
        "rounds": args.rounds,
        "samples_per_s_every_round": {
            name: [round(r[0]["samples_per_s"]) for r in rounds] for name, rounds in runs.items()
        },
        "samples_per_s": {k: round(v) for k, v in rate.items()},
        "sharded_1_over_unsharded": round(rate["sharded_1"] / rate["unsharded"], 3),
        "sharded_2_over_unsharded": round(rate["sharded_2"] / rate["unsharded"], 3),
        "scaling_efficiency_2": round(rate["sharded_2"] / (2 * rate["sharded_1"]), 3),
        "peak_rss_mb": rss,
        "plan_2_ranks": sharded_2[0]["plan"],
    }
    print(
        f"sharded/unsharded: 1 rank {record['sharded_1_over_unsharded']}x, 2 ranks "
        f"{record['sharded_2_over_unsharded']}x; scaling efficiency (2 ranks) "
        f"{record['scaling_efficiency_2']}"
    )
    publish("training_sharded", record)


if __name__ == "__main__":
    main()
