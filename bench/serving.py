"""Benchmark: the whole serving stack on loopback — uvicorn gateway, real Redis, real Triton.

For each catalog (MovieLens-100K, and a synthetic catalog of 1M items) it trains and exports
a release once (cached under bench/results/artifacts/), starts what is not running (a private
redis-server, Triton from the nvidia-pytriton wheel, the gateway), loads the users and the
DLRM embedding rows into Redis (the ranker in Triton reads them through the hierarchical
cache, as it does whenever a Redis is configured; ``--embedding-rows memory`` keeps whole
tables in memory instead), then:

- concurrency 1: every stage runs alone; the server-reported per-stage p50s are summed, and
  the client-measured end-to-end p50 divided by that sum is the orchestration overhead
  (HTTP, JSON, validation, the stage loop);
- fixed concurrency (default 50): p50/p99 latency, requests/s and errors.

It stops everything it started. Prints a table, then one JSON object as the last line (also
written to bench/results/serving.json).

    python bench/serving.py [--catalogs movielens synthetic] [--concurrency 50] [--requests 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
import pandas as pd

from services.local_redis import free_port, start_redis_server

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
STAGES = ("features", "retrieval", "filtering", "scoring", "ordering")
CATALOGS = {
    "movielens": ["--dataset", "movielens"],
    "synthetic": [
        "--dataset",
        "synthetic",
        "--users",
        "100000",
        "--items",
        "1000000",
        "--interactions",
        "1000000",
        "--two-tower-epochs",
        "1",
        "--two-tower-batch",
        "2048",
        "--bpr-epochs",
        "1",
        "--dlrm-epochs",
        "1",
        "--gbm-rounds",
        "50",
        "--eval-users",
        "2000",
    ],
}


def wait_for(url: str, timeout_s: float) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout_s} s")


def ensure_release(name: str) -> Path:
    root = RESULTS / "artifacts" / name
    if not (root / "releases").is_dir() or not any((root / "releases").glob("*/manifest.json")):
        root.mkdir(parents=True, exist_ok=True)
        print(f"training the {name} release once (cached in {root}) ...", flush=True)
        with (root / "train.log").open("w") as log:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "services.cli",
                    "train",
                    "--workdir",
                    str(root / "work"),
                    "--output",
                    str(root),
                    *CATALOGS[name],
                ],
                check=True,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
    return root


def start_redis(stack: list[subprocess.Popen[bytes]], directory: Path) -> str:
    if os.environ.get("CASCADE_REDIS__URL"):
        return os.environ["CASCADE_REDIS__URL"]
    url, process = start_redis_server(directory, persist=True)  # as production: AOF on
    stack.append(process)
    return url


def user_ids(root: Path) -> list[int]:
    release = sorted((root / "releases").glob("*/manifest.json"))[-1].parent
    return pd.read_parquet(release / "online" / "users.parquet")["user_id"].astype(int).tolist()


async def load(url: str, users: list[int], concurrency: int, requests: int, k: int) -> dict:
    """Send ``requests`` POSTs with ``concurrency`` in flight; return latencies and timings."""
    latencies: list[float] = []
    stage_ms: dict[str, list[float]] = {s: [] for s in STAGES}
    errors = degraded = 0
    rng = random.Random(0)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for _ in range(requests):
        # 5% unknown users exercise the cold-start path
        queue.put_nowait(rng.choice(users) if rng.random() > 0.05 else 10**9 + rng.randrange(1000))

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal errors, degraded
        while not queue.empty():
            user = queue.get_nowait()
            started = time.perf_counter()
            try:
                async with session.post(url, json={"user_id": user, "k": k}) as response:
                    body = await response.json()
                    if response.status != 200:
                        errors += 1
                        continue
            except aiohttp.ClientError:
                errors += 1
                continue
            latencies.append(time.perf_counter() - started)
            degraded += bool(body["degraded"])
            for stage in STAGES:
                stage_ms[stage].append(body["timings_ms"].get(stage, 0.0))

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    ms = np.asarray(latencies) * 1000
    return {
        "p50_ms": round(float(np.percentile(ms, 50)), 2) if len(ms) else None,
        "p99_ms": round(float(np.percentile(ms, 99)), 2) if len(ms) else None,
        "rps": round(len(ms) / elapsed, 1),
        "errors": errors,
        "degraded": degraded,
        "stage_p50_ms": {s: round(float(np.median(v)), 3) for s, v in stage_ms.items() if v},
    }


def run_catalog(name: str, args: argparse.Namespace) -> dict:
    root = ensure_release(name)
    stack: list[subprocess.Popen[bytes]] = []
    triton = None
    work = RESULTS / "run"
    work.mkdir(parents=True, exist_ok=True)
    try:
        from services.triton_server import TritonServer

        redis = start_redis(stack, work)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "services.cli",
                "materialize",
                "--artifacts",
                str(root),
                "--redis-url",
                redis,
            ],
            check=True,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )
        triton = TritonServer(
            root / "model_repository",
            http_port=free_port(),
            grpc_port=free_port(),
            metrics_port=free_port(),
            log_file=work / f"triton-{name}.log",
            env={  # the ranker's embedding rows: through the cache on this Redis, or in memory
                "CASCADE_REDIS__URL": redis,
                "CASCADE_EMBEDDING_CACHE__ENABLED": str(args.embedding_rows == "cache"),
            },
        )
        triton.start(timeout_s=120)
        port = free_port()
        env = dict(
            os.environ,
            CASCADE_ARTIFACTS=str(root),
            CASCADE_REDIS__URL=redis,
            CASCADE_TRITON__URL=(
                triton.http_url if args.protocol == "http" else f"127.0.0.1:{triton.grpc_port}"
            ),
            CASCADE_TRITON__PROTOCOL=args.protocol,
            CASCADE_TRITON__TIMEOUT_MS="1000",
            CASCADE_REDIS__TIMEOUT_MS="200",
        )
        stack.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "services.api.app:create_app",
                    "--factory",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--workers",
                    str(args.workers),
                    "--log-level",
                    "warning",
                    "--no-access-log",
                ],
                cwd=ROOT,
                env=env,
            )
        )
        wait_for(f"http://127.0.0.1:{port}/health/ready", 120)
        url = f"http://127.0.0.1:{port}/v1/recommend"
        users = user_ids(root)
        asyncio.run(load(url, users, 4, 200, args.k))  # warm-up
        alone = asyncio.run(load(url, users, 1, args.single_requests, args.k))
        loaded = asyncio.run(load(url, users, args.concurrency, args.requests, args.k))
        stage_sum = sum(alone["stage_p50_ms"].values())
        return {
            "catalog": name,
            "items": int(np.load(sorted((root / "releases").glob("*/item_ids.npy"))[-1]).shape[0]),
            "concurrency": args.concurrency,
            "triton_protocol": args.protocol,
            "embedding_rows": args.embedding_rows,
            "k": args.k,
            "candidates": 300,
            **{k: loaded[k] for k in ("p50_ms", "p99_ms", "rps", "errors", "degraded")},
            "stage_p50_ms": loaded["stage_p50_ms"],
            "alone_p50_ms": alone["p50_ms"],
            "alone_stage_p50_ms": alone["stage_p50_ms"],
            "overhead_ratio": round(alone["p50_ms"] / stage_sum, 2) if stage_sum else None,
        }
    finally:
        for process in reversed(stack):
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
        if triton is not None:
            triton.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--catalogs", nargs="+", choices=list(CATALOGS), default=list(CATALOGS))
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument(
        "--requests", type=int, default=3000, help="requests at the fixed concurrency"
    )
    parser.add_argument(
        "--single-requests", type=int, default=300, help="requests at concurrency 1"
    )
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--workers", type=int, default=1, help="gateway (uvicorn) processes")
    parser.add_argument(
        "--embedding-rows",
        choices=["cache", "memory"],
        default="cache",
        help="the ranker's DLRM rows: device/host/Redis cache (default) or whole tables in memory",
    )
    parser.add_argument("--protocol", choices=["http", "grpc"], default="grpc", help="to Triton")
    args = parser.parse_args()
    runs = [run_catalog(name, args) for name in args.catalogs]
    for run in runs:
        print(
            f"{run['catalog']:>9} ({run['items']:,} items): "
            f"p50 {run['p50_ms']} ms  p99 {run['p99_ms']} ms  "
            f"{run['rps']} req/s  errors {run['errors']}  overhead {run['overhead_ratio']}x  "
            f"stages alone {run['alone_stage_p50_ms']}"
        )
    main_run = runs[-1]
    result = {
        "benchmark": "serving",
        **{
            k: main_run[k]
            for k in (
                "catalog",
                "p50_ms",
                "p99_ms",
                "rps",
                "errors",
                "overhead_ratio",
                "stage_p50_ms",
            )
        },
        "runs": runs,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "serving.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
