"""Benchmark: embedding-row reads from one Redis against a 3-node Redis Cluster on loopback.

One table (``--rows`` x ``--dim`` float32) is written to a private redis-server and to a
private 3-node cluster, the cluster once per key layout:

- ``buckets B``: rows hash-tagged by (version, table, row % B), so a batch is one MGET per
  slot it touches (``services/embedding_cache/cluster.py``; B = 64 is what the cache uses).
  B = 1 is one slot per table (one node holds it all: no scale-out); B = 16384 is about one
  slot per row, as with no hash tag at all (a batch is about one GET per key);
- ``redis-py mget_nonatomic``: redis-py's ``RedisCluster`` splitting the same B = 64 batch by
  slot itself (the off-the-shelf cluster-aware client).

Batches of unique uniformly drawn rows (what reaches Redis: the cache's misses) of each size
in ``--sizes`` are read through ``RedisRows.fetch_many``; every read is checked against the
table. Figures: p50/p99 ms per batch, rows/s, each layout's speed relative to one Redis
(median over batches of single time / layout time; every batch is read by every layout in
turn, so a busy machine slows them alike), and how evenly the layout spreads the table's
rows over the nodes (largest node's share / mean share). One thread, loopback: it measures
the client and round-trip cost of a layout, not a cluster's capacity
(docs/benchmarks/redis_cluster.md).

Then the feature store: ``RedisStore.lookup`` of ``--lookups`` random users out of
``--users`` from one Redis and from the cluster (features on the cluster, streams on the one
Redis), interleaved.

Prints a table, then one JSON object as the last line (also bench/results/redis_cluster.json).

    python bench/redis_cluster.py [--rows 200000] [--batches 200] [--sizes 100,500,2000]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from publish import publish

from services.embedding_cache.backing import RedisRows
from services.embedding_cache.cluster import BUCKETS, SLOTS, ClusterReader, table_slots
from services.embedding_cache.resp import RespConnection
from services.stores.base import UserRecord
from services.stores.redis import RedisStore
from services.util.local_redis import start_redis_server
from services.util.local_redis_cluster import start_redis_cluster

LAYOUTS = (1, 16, BUCKETS, 256, SLOTS)


def timed(
    reads: dict[str, Callable[[np.ndarray], Any]], batches: list[np.ndarray]
) -> dict[str, dict[str, float]]:
    """Per read: rows/s, p50 and p99 ms. Every batch is read by every read in turn (the order
    rotating), so a busy machine slows them alike; ``vs_first`` is the median over batches
    of the first read's time over this read's (> 1 = faster than the first)."""
    names = list(reads)
    seconds = {name: [] for name in names}  # type: dict[str, list[float]]
    for i, keys in enumerate(batches):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            started = time.perf_counter()
            reads[name](keys)
            seconds[name].append(time.perf_counter() - started)
    first = np.asarray(seconds[names[0]])
    out = {}
    for name in names:
        taken = np.asarray(seconds[name])
        ms = taken * 1000
        out[name] = {
            "rows_per_s": round(sum(map(len, batches)) / taken.sum()),
            "p50_ms": round(float(np.percentile(ms, 50)), 3),
            "p99_ms": round(float(np.percentile(ms, 99)), 3),
            "vs_first": round(float(np.median(first / taken)), 3),
        }
    return out


def node_spread(url: str, buckets: int, rows: int) -> float:
    """Largest node's share of the table's rows over the mean share (1.0 = even)."""
    reader = ClusterReader(RespConnection(url, 5.0))
    try:
        reader.refresh()
        slots = table_slots(buckets, "t", buckets)[np.arange(rows) % buckets]
        per_node = np.bincount(reader.node_of_slot[slots], minlength=len(reader.nodes))
    finally:
        reader.close()
    return round(float(per_node.max() / per_node.mean()), 3)


async def feature_lookups(single_url: str, cluster_url: str, users: int, lookups: int) -> dict:
    """``RedisStore.lookup`` (one user's features: one pipelined round trip) from one Redis
    and from the cluster, interleaved; ``vs_single`` as for the rows."""
    stores = {
        "single": RedisStore(single_url, "bench"),
        "cluster": RedisStore(cluster_url, "bench", durable_url=single_url),
    }
    rng = np.random.default_rng(1)
    attributes = {"age": "30", "zip_code": "01234"}
    records = [
        UserRecord(u, attributes, rng.integers(0, 10**5, 20), rng.integers(0, 10**5, 200))
        for u in range(users)
    ]
    seconds: dict[str, list[float]] = {name: [] for name in stores}
    try:
        for store in stores.values():
            await store.start()
            await store.write_users(records)
            await store.mark_loaded(1, users)
        for i, user in enumerate(rng.integers(0, users, lookups).tolist()):
            for name in ("single", "cluster") if i % 2 else ("cluster", "single"):
                started = time.perf_counter()
                found = await stores[name].lookup(user)
                seconds[name].append(time.perf_counter() - started)
                if found.user is None or not found.loaded:
                    raise AssertionError(f"user {user} not found on {name}")
    finally:
        for store in stores.values():
            await store.close()
    single, clustered = np.asarray(seconds["single"]), np.asarray(seconds["cluster"])
    return {
        name: {
            "lookups_per_s": round(len(taken) / taken.sum()),
            "p50_ms": round(float(np.percentile(taken, 50)) * 1000, 3),
            "p99_ms": round(float(np.percentile(taken, 99)) * 1000, 3),
            "vs_single": round(float(np.median(single / taken)), 3),
        }
        for name, taken in (("single", single), ("cluster", clustered))
    }


def check(got: tuple[np.ndarray, np.ndarray], table: np.ndarray, keys: np.ndarray) -> None:
    rows, found = got
    if not found.all() or not np.array_equal(rows, table[keys]):
        raise AssertionError("a layout read rows that differ from the table")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batches", type=int, default=200, help="measured batches per size")
    parser.add_argument("--sizes", default="100,500,2000", help="rows per batch")
    parser.add_argument("--users", type=int, default=10_000, help="users of the feature store")
    parser.add_argument("--lookups", type=int, default=2_000, help="measured feature lookups")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rng = np.random.default_rng(0)
    table = rng.standard_normal((args.rows, args.dim), dtype=np.float32)
    batches = {
        n: [np.sort(rng.choice(args.rows, n, replace=False)) for _ in range(args.batches)]
        for n in sizes
    }

    directory = Path(tempfile.mkdtemp())
    (directory / "single").mkdir()
    url, server = start_redis_server(directory / "single")
    cluster = start_redis_cluster(directory / "cluster")
    readers: list[RedisRows] = []
    results: list[dict[str, Any]] = []
    try:
        single = RedisRows(url, timeout_s=30.0)
        readers.append(single)
        started = time.perf_counter()
        single.write_table(1, "t", table)
        writes = {"single": round(time.perf_counter() - started, 2)}
        layouts: dict[str, Callable[[np.ndarray], Any]] = {}
        spread: dict[str, float] = {}
        for buckets in LAYOUTS:  # each layout under its own version: version = buckets
            rows = RedisRows(cluster.url, timeout_s=30.0)
            rows.buckets = buckets
            readers.append(rows)
            started = time.perf_counter()
            rows.write_table(buckets, "t", table)
            writes[f"buckets_{buckets}"] = round(time.perf_counter() - started, 2)
            name = f"buckets_{buckets}"
            layouts[name] = lambda k, r=rows, b=buckets: r.fetch(b, "t", k, args.dim)
            spread[name] = node_spread(cluster.url, buckets, args.rows)
        chosen = readers[1 + LAYOUTS.index(BUCKETS)]
        layouts["redis_py_mget_nonatomic"] = lambda k: chosen.client.mget_nonatomic(  # type: ignore[attr-defined]
            chosen._cluster_names(BUCKETS, [("t", k)])[0]
        )
        spread["redis_py_mget_nonatomic"] = spread[f"buckets_{BUCKETS}"]
        print(f"wrote {args.rows:,} rows x {args.dim}: seconds {writes}", flush=True)

        for size in sizes:
            for keys in batches[size][:3]:  # every layout reads the table's rows, warm-up too
                check(single.fetch(1, "t", keys, args.dim), table, keys)
                for buckets in LAYOUTS:
                    got = layouts[f"buckets_{buckets}"](keys)
                    check(got, table, keys)
            reads = {"single": lambda k: single.fetch(1, "t", k, args.dim), **layouts}
            figures = timed(reads, batches[size])
            row: dict[str, Any] = {"batch": size}
            for name, measured in figures.items():
                measured["vs_single"] = measured.pop("vs_first")
                if name in spread:
                    measured["node_spread"] = spread[name]
                row[name] = measured
            base = row["single"]
            results.append(row)
            print(
                f"batch {size}: single {base['rows_per_s']:,} rows/s p50 {base['p50_ms']} ms | "
                + " | ".join(
                    f"{name} {row[name]['vs_single']}x p50 {row[name]['p50_ms']} ms"
                    for name in layouts
                ),
                flush=True,
            )
        features = asyncio.run(feature_lookups(url, cluster.url, args.users, args.lookups))
        print(
            f"feature lookups: single p50 {features['single']['p50_ms']} ms | cluster "
            f"{features['cluster']['vs_single']}x p50 {features['cluster']['p50_ms']} ms",
            flush=True,
        )
    finally:
        for reader in readers:
            reader.close()
        cluster.stop()
        server.kill()
        server.wait()
        shutil.rmtree(directory, ignore_errors=True)
    publish(
        "redis_cluster",
        {
            "benchmark": "redis_cluster",
            "rows": args.rows,
            "dim": args.dim,
            "nodes": len(cluster.ports),
            "chosen_buckets": BUCKETS,
            "write_s": writes,
            "results": results,
            "feature_lookups": features,
        },
    )


if __name__ == "__main__":
    main()
