"""Benchmark: the sparse-table optimizer step, ``LazyAdam`` against ``torch.optim.SparseAdam``.

For each table shape the training step meets at 1M items (the two-tower's history table,
whose batch looks up 20 history items per row; its item table; BPR-MF's item table; a
user table), both optimizers step the same table on the same gradients, one after the
other, and each step is timed once the tables' pages are all touched (the first
``--warmup`` steps are not timed). Prints ms per step and the ratio SparseAdam / LazyAdam
for each, and the largest difference between the two tables after the run (they do the same
arithmetic). One JSON object as the last line (also ``bench/results/sparse_optimizer.json``).

    python bench/sparse_optimizer.py
    python bench/sparse_optimizer.py --steps 100 --warmup 50
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from publish import publish

from pipelines.training.lazy_adam import LazyAdam

# (name, rows, dim, ids per batch): what one step of the 1M-item example looks up
SHAPES = (
    ("two-tower history", 1_000_000, 32, 512 * 20),
    ("two-tower item id", 1_000_000, 32, 512),
    ("bpr-mf items", 1_000_000, 64, 2 * 1024),
    ("two-tower user id", 100_000, 16, 512),
)


def measure(rows: int, dim: int, ids: int, steps: int, warmup: int) -> dict[str, float]:
    torch.manual_seed(0)
    tables = {name: torch.nn.Embedding(rows, dim, sparse=True) for name in ("sparse", "lazy")}
    tables["lazy"].load_state_dict(tables["sparse"].state_dict())
    optimizers = {
        "sparse": torch.optim.SparseAdam([tables["sparse"].weight], lr=1e-3),
        "lazy": LazyAdam([tables["lazy"].weight], lr=1e-3),
    }
    spent = dict.fromkeys(tables, 0.0)
    for step in range(warmup + steps):
        batch = torch.randint(0, rows, (ids,))
        for name, table in tables.items():
            optimizers[name].zero_grad()
            table(batch).square().sum().backward()
            started = time.perf_counter()
            optimizers[name].step()
            if step >= warmup:
                spent[name] += time.perf_counter() - started
    gap = (tables["sparse"].weight - tables["lazy"].weight).abs().max().item()
    return {
        "sparse_adam_ms": round(spent["sparse"] / steps * 1e3, 3),
        "lazy_adam_ms": round(spent["lazy"] / steps * 1e3, 3),
        "ratio": round(spent["sparse"] / spent["lazy"], 2),
        "max_difference": gap,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="timed steps per shape")
    parser.add_argument("--warmup", type=int, default=100, help="untimed steps first")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = {}
    for name, rows, dim, ids in SHAPES:
        result = measure(rows, dim, ids, args.steps, args.warmup)
        results[name] = {"rows": rows, "dim": dim, "ids_per_batch": ids, **result}
        print(
            f"{name:20s} {rows:>9,} x {dim:<3d} {ids:>6} ids: SparseAdam "
            f"{result['sparse_adam_ms']:.2f} ms, LazyAdam {result['lazy_adam_ms']:.2f} ms, "
            f"ratio {result['ratio']:.2f}x (tables differ by {result['max_difference']:.1e})",
            flush=True,
        )
    publish("sparse_optimizer", {"threads": args.threads, "shapes": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
