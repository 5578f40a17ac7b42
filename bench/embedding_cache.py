"""Benchmark: the hierarchical embedding cache vs Redis-only lookups vs a full in-memory table.

A 10M-row x 64-dim float32 table is written to a private redis-server (binary rows, one key
each). Zipf(alpha) key streams (hot ids scattered over the table by a random permutation)
are looked up in batches of 2,000 keys:

- cache: device tier = capacity / 4, host tier = capacity (5% or 20% of the rows), LRU,
  asynchronous inserts above a 0.9 hit ratio; warmed up first, then measured;
- Redis only: one pipelined MGET of the batch's unique keys, every batch;
- the limit: ``index_select`` on the whole table in memory.

Prints a table, then one JSON object as the last line (also bench/results/embedding_cache.json).

    python bench/embedding_cache.py [--rows 10000000] [--batches 300]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from services.embedding_cache.backing import RedisRows
from services.embedding_cache.cache import CacheConfig, HierarchicalEmbeddingCache
from services.local_redis import start_redis_server

RESULTS = Path(__file__).resolve().parent / "results"


def zipf_stream(alpha: float, rows: int, batches: int, batch: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scatter = rng.permutation(rows)
    ranks = (rng.zipf(alpha, batches * batch) - 1) % rows
    return scatter[ranks].reshape(batches, batch)


def timed(fn, batches: np.ndarray) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    """lookups/s, p50 ms, p99 ms over the batches."""
    latencies = []
    for keys in batches:
        started = time.perf_counter()
        fn(keys)
        latencies.append(time.perf_counter() - started)
    ms = np.asarray(latencies) * 1000
    return batches.size / sum(latencies), float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2_000)
    parser.add_argument(
        "--batches", type=int, default=300, help="measured batches per configuration"
    )
    parser.add_argument("--warmup", type=int, default=300, help="batches before measuring")
    args = parser.parse_args()
    torch.set_num_threads(1)

    table = np.random.default_rng(0).standard_normal((args.rows, args.dim), dtype=np.float32)
    directory = tempfile.mkdtemp()
    url, server = start_redis_server(Path(directory))
    try:
        backing = RedisRows(url, timeout_s=30.0)
        started = time.perf_counter()
        backing.write_table(1, "t", table)
        write_s = time.perf_counter() - started
        print(f"wrote {args.rows:,} rows to Redis in {write_s:.1f} s", flush=True)

        tensor = torch.from_numpy(table)
        runs = []
        for alpha in (1.05, 1.2):
            stream = zipf_stream(
                alpha, args.rows, args.warmup + args.batches, args.batch, seed=int(alpha * 100)
            )
            warm, measured = stream[: args.warmup], stream[args.warmup :]
            in_memory = timed(lambda k: tensor.index_select(0, torch.from_numpy(k)), measured)
            redis_only = timed(lambda k: backing.fetch(1, "t", np.unique(k), args.dim), measured)
            for capacity in (0.05, 0.2):
                cache = HierarchicalEmbeddingCache(
                    backing,
                    1,
                    {"t": args.rows},
                    args.dim,
                    CacheConfig(device_capacity=capacity / 4, host_capacity=capacity),
                    device=torch.device("cuda" if torch.cuda.is_available() else "cpu"),
                )
                for keys in warm:
                    cache.lookup(keys[:, None])
                cache.flush()
                stats = cache.caches[0].stats
                before = dict(stats)
                rate, p50, p99 = timed(lambda k, c=cache: c.lookup(k[:, None]), measured)
                after = cache.caches[0].stats
                delta = {k: after[k] - before[k] for k in after}
                cache.close()
                runs.append(
                    {
                        "alpha": alpha,
                        "capacity": capacity,
                        "hit_ratio": round(delta["key_hits"] / delta["keys"], 4),
                        "unique_hit_ratio": round(
                            (delta["device_hits"] + delta["host_hits"]) / delta["unique"], 4
                        ),
                        "device_hit_ratio": round(delta["device_hits"] / delta["unique"], 4),
                        "lookups_per_s": round(rate),
                        "p50_ms": round(p50, 3),
                        "p99_ms": round(p99, 3),
                        "redis_only": {
                            "lookups_per_s": round(redis_only[0]),
                            "p50_ms": round(redis_only[1], 3),
                            "p99_ms": round(redis_only[2], 3),
                        },
                        "in_memory": {
                            "lookups_per_s": round(in_memory[0]),
                            "p50_ms": round(in_memory[1], 3),
                            "p99_ms": round(in_memory[2], 3),
                        },
                        "vs_redis_only": round(rate / redis_only[0], 1),
                        "fraction_of_in_memory": round(rate / in_memory[0], 3),
                    }
                )
                run = runs[-1]
                print(
                    f"alpha {alpha} cache {capacity:.0%}: hit {run['hit_ratio']:.3f} "
                    f"{run['lookups_per_s']:,} lookups/s "
                    f"p50 {run['p50_ms']} ms p99 {run['p99_ms']} ms | "
                    f"redis-only {run['redis_only']['lookups_per_s']:,}/s "
                    f"({run['vs_redis_only']}x) | "
                    f"in-memory {run['in_memory']['lookups_per_s']:,}/s",
                    flush=True,
                )
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(directory, ignore_errors=True)
    result = {
        "benchmark": "embedding_cache",
        "rows": args.rows,
        "dim": args.dim,
        "batch": args.batch,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "redis_write_s": round(write_s, 1),
        "configs": runs,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "embedding_cache.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
