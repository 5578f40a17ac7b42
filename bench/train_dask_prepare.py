"""Benchmark: ``cascade train prepare`` in one process against ``--fit-workers N``.

Each run is the real command in a child process on the synthetic generator (same seed,
fresh work directory), the modes alternating over ``--rounds``. Timed: wall seconds of the
whole step (the cluster's start and the partition writes included); peak RSS of the
largest process of the run (driver or worker, from ``wait4``). Each cluster run's fitted
workflow is compared with the in-memory run's, file by file (they must be equal). Last
line: one JSON object (also written to ``bench/results/train_dask_prepare.json``).

    python bench/train_dask_prepare.py [--interactions 1000000] [--workers 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(arguments: list[str], workdir: Path) -> dict[str, float]:
    """Wall seconds and peak RSS (MB, largest process) of one ``cascade train prepare``."""
    shutil.rmtree(workdir, ignore_errors=True)
    command = [sys.executable, "-m", "cli.main", "train", "prepare", *arguments]
    started = time.perf_counter()
    child = subprocess.Popen(
        [*command, "--workdir", str(workdir)], cwd=ROOT, stdout=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command)} failed")
    return {"seconds": seconds, "peak_rss_mb": usage.ru_maxrss / 1024}


def same_workflow(left: Path, right: Path) -> bool:
    names = sorted(p.name for p in left.iterdir())
    _, mismatch, errors = filecmp.cmpfiles(left, right, names, shallow=False)
    return not mismatch and not errors and names == sorted(p.name for p in right.iterdir())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interactions", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/cascade-train-dask"))
    args = parser.parse_args()
    data = ["--dataset", "synthetic", "--users", "20000", "--items", "5000", "--seed", "0"]
    data += ["--interactions", str(args.interactions)]
    modes = {"memory": [], "dask": ["--fit-workers", str(args.workers)]}
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    equal = True
    for round_ in range(args.rounds):
        for mode, extra in modes.items():
            result = run([*data, *extra], args.workdir / mode)
            runs[mode].append(result)
            print(
                f"round {round_ + 1} {mode:<6} {result['seconds']:6.1f} s  "
                f"peak RSS {result['peak_rss_mb']:6.0f} MB",
                flush=True,
            )
        equal &= same_workflow(args.workdir / "memory/workflow", args.workdir / "dask/workflow")
    best = {mode: min(r["seconds"] for r in results) for mode, results in runs.items()}
    ratio = best["memory"] / best["dask"]
    print(f"best of {args.rounds}: dask x{args.workers} runs at {ratio:.2f}x the one-process speed")
    record = {
        "interactions": args.interactions,
        "workers": args.workers,
        "cpus": os.cpu_count(),
        "runs": {m: [{k: round(v, 2) for k, v in r.items()} for r in rs] for m, rs in runs.items()},
        "speed_ratio_dask_over_memory": round(ratio, 3),
        "workflow_equal": equal,
    }
    (ROOT / "bench" / "results").mkdir(exist_ok=True)
    (ROOT / "bench" / "results" / "train_dask_prepare.json").write_text(json.dumps(record))
    print(json.dumps(record))


if __name__ == "__main__":
    main()
