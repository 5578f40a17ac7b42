"""Benchmark: the hierarchical embedding cache vs Redis-only lookups vs a full in-memory table.

A 10M-row x 64-dim float32 table is written to a private redis-server (binary rows, one key
each). Zipf(alpha) key streams (hot ids scattered over the table by a random permutation)
are looked up in batches of 2,000 keys:

- cache: device tier = capacity / 4, host tier = capacity (5% or 20% of the rows), LRU,
  asynchronous work above a hit ratio of ``--async-threshold``; each capacity with both miss
  policies: ``fetch`` (exact: misses read from Redis on the request path) and ``defer``
  (misses above the threshold answered with the default row, read in the background; its
  ``deferred_ratio`` is the share of keys so answered); warmed up first, then measured;
- Redis only, two ways: a pipeline of one GET per key of the batch (redis-py), and one MGET
  of the batch's unique keys over the same connection the cache uses (the stronger one);
- the limit: ``index_select`` on the whole table in memory.

Prints a table, then one JSON object as the last line (also bench/results/embedding_cache.json).

    python bench/embedding_cache.py [--rows 10000000] [--batches 300]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from publish import publish

from services.embedding_cache.backing import RedisRows
from services.embedding_cache.cache import CacheConfig, HierarchicalEmbeddingCache
from services.util.local_redis import start_redis_server


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


def figures(measured: tuple[float, float, float]) -> dict[str, float]:
    rate, p50, p99 = measured
    return {"lookups_per_s": round(rate), "p50_ms": round(p50, 3), "p99_ms": round(p99, 3)}


def pipelined_gets(backing: RedisRows, keys: np.ndarray) -> list:
    """The plain Redis-only client: one GET per key of the batch, in one pipeline."""
    prefix = backing.prefix(1, "t")
    pipe = backing.client.pipeline(transaction=False)
    for key in keys.tolist():
        pipe.get(f"{prefix}{key}")
    return pipe.execute()


def measure_cache(
    backing: RedisRows,
    args: argparse.Namespace,
    alpha: float,
    capacity: float,
    miss_policy: str,
    warm: np.ndarray,
    measured: np.ndarray,
) -> dict:
    cache = HierarchicalEmbeddingCache(
        backing,
        1,
        {"t": args.rows},
        args.dim,
        CacheConfig(
            device_capacity=capacity / 4,
            host_capacity=capacity,
            async_threshold=args.async_threshold,
            miss_policy=miss_policy,  # type: ignore[arg-type]
        ),
        device=torch.device("cuda" if torch.cuda.is_available() else "cpu"),
    )
    try:
        for keys in warm:
            cache.lookup(keys[:, None])
        cache.flush()
        before = dict(cache.stats)
        rate, p50, p99 = timed(lambda k: cache.lookup(k[:, None]), measured)
        delta = {k: cache.stats[k] - before[k] for k in before}
    finally:
        cache.close()
    return {
        "alpha": alpha,
        "capacity": capacity,
        "miss_policy": miss_policy,
        "hit_ratio": round(delta["key_hits"] / delta["keys"], 4),
        "device_hit_ratio": round(delta["device_hits"] / delta["keys"], 4),
        "deferred_ratio": round(delta["deferred"] / delta["keys"], 4),
        "lookups_per_s": round(rate),
        "p50_ms": round(p50, 3),
        "p99_ms": round(p99, 3),
    }


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
    parser.add_argument("--warmup", type=int, default=1000, help="batches before measuring")
    parser.add_argument("--async-threshold", type=float, default=0.85)
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
            redis_mget = timed(lambda k: backing.fetch(1, "t", np.unique(k), args.dim), measured)
            redis_get = timed(lambda k: pipelined_gets(backing, k), measured)
            for capacity in (0.05, 0.2):
                for miss_policy in ("fetch", "defer"):
                    runs.append(
                        measure_cache(backing, args, alpha, capacity, miss_policy, warm, measured)
                    )
                    run = runs[-1]
                    run["redis_only_get"] = figures(redis_get)
                    run["redis_only_mget"] = figures(redis_mget)
                    run["in_memory"] = figures(in_memory)
                    run["vs_redis_only_get"] = round(run["lookups_per_s"] / redis_get[0], 1)
                    run["vs_redis_only_mget"] = round(run["lookups_per_s"] / redis_mget[0], 1)
                    run["fraction_of_in_memory"] = round(run["lookups_per_s"] / in_memory[0], 3)
                    print(
                        f"alpha {alpha} cache {capacity:.0%} {miss_policy}: "
                        f"hit {run['hit_ratio']:.3f} deferred {run['deferred_ratio']:.3f} "
                        f"{run['lookups_per_s']:,} lookups/s "
                        f"p50 {run['p50_ms']} ms p99 {run['p99_ms']} ms | redis-only "
                        f"GET {round(redis_get[0]):,}/s ({run['vs_redis_only_get']}x) "
                        f"MGET {round(redis_mget[0]):,}/s ({run['vs_redis_only_mget']}x) | "
                        f"in-memory {round(in_memory[0]):,}/s "
                        f"({run['fraction_of_in_memory']:.2f} of it)",
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
        "async_threshold": args.async_threshold,
        "configs": runs,
    }
    publish("embedding_cache", result)


if __name__ == "__main__":
    main()
