"""Benchmark: Cascade's parquet batch loader vs torch's item-by-item DataLoader.

Both read the same DLRM-shaped rows (26 int32 categorical ids, 13 float32 dense features,
1 float32 label) and yield shuffled batches of the same size. The baseline gets its data
already in memory (its read time is not counted); ours reads parquet from the page cache
every epoch. Prints a table, then one JSON object as the last line; also writes
``bench/results/dataloader.json``.

    python bench/dataloader.py [--rows 8000000] [--batch 8192] [--epochs 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from publish import publish
from torch.utils.data import DataLoader, Dataset

from pipelines.dataloader import ParquetBatchLoader
from pipelines.storage import write_parquet

N_SPARSE, N_DENSE = 26, 13
GROUPS = {
    "sparse": [f"sparse_{j}" for j in range(N_SPARSE)],
    "dense": [f"dense_{j}" for j in range(N_DENSE)],
    "label": ["label"],
}


def make_parquet(path: Path, rows: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    columns: dict[str, np.ndarray] = {
        f"sparse_{j}": rng.integers(0, 1_000_000, rows, dtype=np.int32) for j in range(N_SPARSE)
    }
    columns.update({f"dense_{j}": rng.random(rows, dtype=np.float32) for j in range(N_DENSE)})
    columns["label"] = (rng.random(rows) < 0.25).astype(np.float32)
    write_parquet(path, columns, row_group_size=262_144)


class RowDataset(Dataset):
    """The textbook map-style dataset: one row per ``__getitem__``."""

    def __init__(self, path: Path) -> None:
        table = pq.read_table(path)
        self.sparse = np.stack([table.column(c).to_numpy() for c in GROUPS["sparse"]], axis=1)
        self.dense = np.stack([table.column(c).to_numpy() for c in GROUPS["dense"]], axis=1)
        self.label = table.column("label").to_numpy()

    def __len__(self) -> int:
        return len(self.label)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (
            torch.from_numpy(self.sparse[i]),
            torch.from_numpy(self.dense[i]),
            torch.tensor(self.label[i]),
        )


def time_baseline(path: Path, batch: int, max_seconds: float) -> float:
    loader = DataLoader(RowDataset(path), batch_size=batch, shuffle=True, num_workers=0)
    rows, started = 0, time.perf_counter()
    for sparse, _, _ in loader:
        rows += len(sparse)
        if time.perf_counter() - started > max_seconds:
            break
    return rows / (time.perf_counter() - started)


def time_ours(path: Path, batch: int, epochs: int, workers: int) -> float:
    loader = ParquetBatchLoader(
        [path], GROUPS, batch, buffer_chunks=1, workers=workers, dtypes={"sparse": torch.int32}
    )
    best = 0.0
    for _ in range(epochs):
        rows, started = 0, time.perf_counter()
        for item in loader:
            rows += len(item["label"])
        best = max(best, rows / (time.perf_counter() - started))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=8_000_000, help="rows in the parquet file")
    parser.add_argument("--batch", type=int, default=8192, help="batch size of both loaders")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of our loader (best is kept)")
    parser.add_argument(
        "--baseline-seconds", type=float, default=10.0, help="time budget of the baseline"
    )
    args = parser.parse_args()
    torch.set_num_threads(2)

    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "dlrm_rows.parquet"
        make_parquet(path, args.rows)
        baseline = time_baseline(path, args.batch, args.baseline_seconds)
        ours = time_ours(path, args.batch, args.epochs, workers=2)
        one_worker = time_ours(path, args.batch, args.epochs, workers=1)

    result = {
        "benchmark": "dataloader",
        "rows": args.rows,
        "batch_size": args.batch,
        "row_shape": {"sparse_int32": N_SPARSE, "dense_float32": N_DENSE, "label_float32": 1},
        "baseline_samples_per_s": round(baseline),
        "ours_samples_per_s": round(ours),
        "ratio": round(ours / baseline, 1),
        "ours_one_worker_samples_per_s": round(one_worker),
        "shuffle": "row-level permutation within each buffer + chunk order",
        "shuffle_buffer_rows": 262_144,
        "torch_threads": torch.get_num_threads(),
    }
    for name, rate, ratio in (
        ("torch DataLoader (item by item)", baseline, 1.0),
        ("ParquetBatchLoader, 2 workers", ours, result["ratio"]),
        ("ParquetBatchLoader, 1 worker", one_worker, round(one_worker / baseline, 1)),
    ):
        print(f"{name}: {rate:>14,.0f} samples/s  ({ratio}x)")
    publish("dataloader", result)


if __name__ == "__main__":
    main()
