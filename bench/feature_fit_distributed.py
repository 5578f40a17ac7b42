"""Benchmark: the feature workflow's fit in memory against the same fit on a Dask
LocalCluster of 1 and 2 workers (pipelines/features_distributed.py).

It generates a synthetic data set once (kept under ``--workdir``) in the ingested layout
(``interactions/part-*.parquet``). Each step runs in a child process: ``memory`` reads the
interactions whole and fits as ``prepare`` does (hashed split, ``Workflow.fit_transform``);
``dask-N`` starts a LocalCluster of N single-threaded workers and fits from the partitions,
each worker reading its own. Timed: the read and fit together (the cluster's start apart),
and the CPU seconds of the driver and workers together (on a shared machine, wall time
is what the other tenants leave; CPU time is the work); peak RSS of the driver and of
the largest worker. Every fitted workflow is compared with the
in-memory one (they must be equal). Last line: one JSON object (also written to
``bench/results/feature_fit_distributed.json``).

    python bench/feature_fit_distributed.py [--rows 4000000] [--workers 1,2] [--quick]

Also the ``dask`` part of ``bench/training_distributed.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from publish import publish


def partition_rows(rows: int) -> int:
    """Rows per Dask partition (row groups of this size are written): at most 2^19, and at
    least 8 partitions."""
    return max(min(1 << 19, rows // 8), 1 << 12)


def data_rows(directory: Path) -> int:
    """The interactions of the data set in ``directory`` (named by ``main``)."""
    return int(directory.parent.name.removeprefix("rows-"))


def peak_rss_gb() -> float:
    """This process's peak resident memory (VmHWM: since its exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024**2, 2)
    return float("nan")


def cpu_seconds() -> float:
    """CPU time this process has used (user and system)."""
    times = os.times()
    return times.user + times.system


def generate(directory: Path, rows: int) -> None:
    from pipelines.data.synthetic import make_synthetic
    from pipelines.partitions import write_partitions

    if (directory / "schema.json").exists():
        return
    dataset = make_synthetic(
        n_users=max(rows // 50, 100), n_items=max(rows // 200, 100), n_interactions=rows, seed=0
    )
    size = partition_rows(rows)
    write_partitions(dataset, directory, file_rows=8 * size, group_rows=size)


def fit_in_memory(directory: Path) -> dict[str, Any]:
    import pandas as pd

    from core.features.rows import AttributeTable, labelled_rows
    from core.features.spec import build_workflow
    from pipelines.partitions import read_schema
    from pipelines.split import hashed_split

    started, cpu = time.perf_counter(), time.process_time()
    schema = read_schema(directory)
    parts = sorted((directory / "interactions").glob("part-*.parquet"))
    interactions = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
    users = AttributeTable(
        pd.read_parquet(directory / "users.parquet"), "user_id", schema.user_attributes
    )
    items = AttributeTable(
        pd.read_parquet(directory / "items.parquet"), "item_id", schema.item_attributes
    )
    rows = labelled_rows(interactions, users, items)
    train = hashed_split(interactions, 0).train
    loaded = time.perf_counter()
    workflow = build_workflow(schema, seed=0)
    workflow.fit_transform({k: v[train] for k, v in rows.items()})
    done = time.perf_counter()
    workflow.save(directory.parent / "fitted-memory")
    return {
        "seconds": done - started,
        "fit_seconds": done - loaded,
        "cpu_seconds": time.process_time() - cpu,
        "rows": len(train),
    }


def fit_on_dask(directory: Path, workers: int) -> dict[str, Any]:
    from distributed import wait

    from core.features.spec import build_workflow
    from pipelines import features_distributed as fd
    from pipelines.partitions import read_schema

    started = time.perf_counter()
    with fd.dask_client(workers) as client:
        client.run(lambda: None)  # every worker up
        ready, cpu = time.perf_counter(), time.process_time()
        before = client.run(cpu_seconds)
        workflow = build_workflow(read_schema(directory), seed=0)
        size = partition_rows(data_rows(directory))
        rows = fd.load_rows(client, directory, "train", 0, rows=size)
        encoded = fd.fit(client, rows, workflow)
        wait(encoded)  # every partition encoded
        done = time.perf_counter()
        driver_cpu = time.process_time() - cpu
        after = client.run(cpu_seconds)
        worker_rss = max(client.run(peak_rss_gb).values())
    workflow.save(directory.parent / f"fitted-dask-{workers}")
    return {
        "seconds": done - ready,
        "start_seconds": ready - started,
        "worker_peak_rss_gb": worker_rss,
        "cpu_seconds": driver_cpu + sum(after[w] - before[w] for w in after),
        "partitions": len(rows),
    }


def same_fit(left: Path, right: Path) -> bool:
    with np.load(left / "arrays.npz") as a, np.load(right / "arrays.npz") as b:
        return sorted(a.files) == sorted(b.files) and all(
            a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a.files
        )


def in_child(step: str, directory: Path) -> dict[str, Any]:
    """Run ``step`` in a child process; its result, with the child's peak RSS in GB."""
    child = subprocess.run(
        [sys.executable, __file__, "--child", step, str(directory)],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if child.returncode != 0:
        raise SystemExit(f"{step} failed (status {child.returncode})")
    return json.loads(child.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4_000_000, help="synthetic interactions")
    parser.add_argument("--workers", default="1,2", help="Dask worker counts to run")
    parser.add_argument("--quick", action="store_true", help="300k interactions")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/cascade-feature-fit"))
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        step, directory = args.child[0], Path(args.child[1])
        if step == "generate":
            generate(directory, data_rows(directory))
            result: dict[str, Any] = {}
        elif step == "memory":
            result = fit_in_memory(directory)
        else:
            result = fit_on_dask(directory, int(step.removeprefix("dask-")))
        result["peak_rss_gb"] = peak_rss_gb()
        print(json.dumps(result), flush=True)
        return

    if args.quick:
        args.rows = 300_000
    directory = args.workdir / f"rows-{args.rows}" / "data"
    directory.mkdir(parents=True, exist_ok=True)
    in_child("generate", directory)
    memory = in_child("memory", directory)
    print(
        f"in memory   read+fit {memory['seconds']:6.1f} s (fit {memory['fit_seconds']:.1f} s)"
        f"  cpu {memory['cpu_seconds']:.1f} s"
        f"  peak RSS {memory['peak_rss_gb']:.2f} GB  training rows {memory['rows']:,}",
        flush=True,
    )
    record: dict[str, Any] = {"rows": args.rows, "training_rows": memory["rows"]}
    record["memory"] = {k: round(v, 2) for k, v in memory.items()}
    for workers in [int(w) for w in args.workers.split(",")]:
        run = in_child(f"dask-{workers}", directory)
        equal = same_fit(
            directory.parent / "fitted-memory", directory.parent / f"fitted-dask-{workers}"
        )
        ratio = memory["seconds"] / run["seconds"]
        print(
            f"dask x{workers}     read+fit {run['seconds']:6.1f} s"
            f" (start {run['start_seconds']:.1f} s)  cpu {run['cpu_seconds']:.1f} s"
            f"  driver {run['peak_rss_gb']:.2f} GB  worker {run['worker_peak_rss_gb']:.2f} GB"
            f"  memory/dask {ratio:.2f}x  same fit: {equal}",
            flush=True,
        )
        record[f"dask_{workers}"] = {
            **{k: round(v, 2) for k, v in run.items()},
            "speedup_vs_memory": round(ratio, 2),
            "equal": equal,
        }
    if "dask_1" in record and "dask_2" in record:  # throughput with 2 / (2 x throughput with 1)
        one, two = record["dask_1"]["seconds"], record["dask_2"]["seconds"]
        record["scaling_efficiency_2"] = round(one / (2 * two), 2)
        print(f"scaling efficiency, 2 workers: {record['scaling_efficiency_2']:.2f}", flush=True)
    publish("feature_fit_distributed", record)


if __name__ == "__main__":
    main()
