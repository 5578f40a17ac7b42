"""Benchmark: serving throughput at a latency SLO, open loop, on loopback.

For each catalog (MovieLens-100K, or a synthetic catalog of 1M items; a release is trained
and exported once and cached under bench/results/artifacts/) and each configuration

- ``embedded``: the gateway alone (models in process, in-memory store);
- ``full``: the production shape: a private redis-server (features, impressions, and the
  ranker's embedding rows when they exceed the in-memory budget), Triton from the
  nvidia-pytriton wheel for the ranker (``--protocol`` http or grpc), the query tower where
  the settings place it (``--query-tower``), the gateway;

it measures

- the highest Poisson arrival rate whose p99 latency stays within the SLO (default 50 ms),
  latency counted from each request's *scheduled* time so queueing is not hidden: the rate
  steps up by ``--step`` x until a probe fails the SLO (or errors), then bisects;
- CPU-ms per request of every server process (gateway workers, tritonserver, each python
  stub, redis) from /proc/<pid>/stat at a fixed rate (``--cpu-rate``), with the load
  generator's own CPU reported and excluded;
- the compute floor in the same run: the stages' numeric work in one tight loop
  (bench/serving_floor.py), and the ratio of the servers' CPU to it;
- the HTTP floor: a bare ASGI app with a fixed answer of the same shape, on the gateway's
  uvicorn options (bench/http_floor.py), driven by the same load generator;
- the capacity budget per configuration: the CPU-ms per request the cores give at the
  target rate (600 requests/s embedded, 500 full), less the compute floor, the load
  generator and the bare HTTP server, and the rates at which the cores would be saturated.

It stops everything it started. Progress goes to stdout line by line; the last line is one
JSON object (also written to bench/results/serving.json).

    python bench/serving.py [--catalogs synthetic] [--configs embedded full] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import numpy as np
from http_floor import measure as measure_http_floor
from openloop import (
    Probe,
    ProcessGroup,
    children,
    open_loop,
    ranker_counts,
    search_rate,
    triton_processes,
)
from publish import publish
from serving_floor import compute_floor
from serving_release import CATALOGS, RESULTS, ROOT, ensure_release, user_ids

from services.util.local_redis import free_port, start_redis_server

CONFIGS = ("embedded", "full")
TARGET_RPS = {"embedded": 600.0, "full": 500.0}  # issue 12's targets at p99 <= 50 ms
EMBEDDING_ROWS = {  # the ranker's environment in Triton, per --embedding-rows
    "auto": {},
    "cache": {"CASCADE_EMBEDDING_CACHE__IN_MEMORY_MAX_MB": "0"},
    "memory": {"CASCADE_EMBEDDING_CACHE__ENABLED": "false"},
}


def log(line: str) -> None:
    print(line, flush=True)


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


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()


def start_gateway(
    env: dict[str, str], workers: int, group: ProcessGroup
) -> tuple[str, subprocess.Popen[bytes]]:
    """``cascade serve`` on a free loopback port, as users run it (the guarded HTTP protocol,
    multiprocess metrics with workers); its processes' CPU is sampled as ``gateway``."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli.main",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(workers),
        ],
        cwd=ROOT,
        env={**os.environ, **env},
    )
    try:
        wait_for(f"http://127.0.0.1:{port}/health/ready", 180)
    except RuntimeError:
        stop(process)
        raise
    group.add("gateway", process.pid)
    for child in children(process.pid):
        group.add("gateway", child)
    return f"http://127.0.0.1:{port}/v1/recommend", process


@contextmanager
def stack(
    config: str, root: Path, args: argparse.Namespace
) -> Iterator[tuple[str, ProcessGroup, str | None]]:
    """Start one configuration; yield the recommend URL, its server processes and Triton's
    metrics URL (None without Triton)."""
    from services.inference.triton_server import TritonServer

    group = ProcessGroup()
    started: list[subprocess.Popen[bytes]] = []
    triton = None
    work = RESULTS / "run"
    work.mkdir(parents=True, exist_ok=True)
    env = {"CASCADE_ARTIFACTS": str(root), "CASCADE_FEEDBACK__REQUIRE_DURABLE": "false"}
    try:
        if config == "full":
            redis_url, redis = start_redis_server(work, persist=True)  # as production: AOF on
            started.append(redis)
            group.add("redis", redis.pid)
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "cli.main",
                    "materialize",
                    "--artifacts",
                    str(root),
                    "--redis-url",
                    redis_url,
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
                log_file=work / f"triton-{root.name}.log",
                env={"CASCADE_REDIS__URL": redis_url, **EMBEDDING_ROWS[args.embedding_rows]},
            )
            triton.start(timeout_s=180)
            assert triton.process is not None
            triton_processes(group, triton.process.pid)
            env.update(
                CASCADE_REDIS__URL=redis_url,
                CASCADE_TRITON__URL=(
                    triton.http_url if args.protocol == "http" else f"127.0.0.1:{triton.grpc_port}"
                ),
                CASCADE_TRITON__PROTOCOL=args.protocol,
                CASCADE_TRITON__TIMEOUT_MS="1000",
                CASCADE_REDIS__TIMEOUT_MS="200",
                CASCADE_TRITON__QUERY_TOWER=args.query_tower,
            )
        url, gateway = start_gateway(env, args.workers, group)
        started.append(gateway)
        metrics = f"http://127.0.0.1:{triton.metrics_port}/metrics" if triton else None
        yield url, group, metrics
    finally:
        for process in reversed(started):
            stop(process)
        if triton is not None:
            triton.stop()


def run_config(config: str, root: Path, users: list[int], args: argparse.Namespace) -> dict:
    log(f"  {config}: starting ...")
    with stack(config, root, args) as (url, group, metrics):

        def probe(rate: float, seconds: float | None = None) -> Probe:
            return asyncio.run(
                open_loop(
                    url,
                    users,
                    rate,
                    seconds or args.probe_s,
                    args.k,
                    group,
                    seed=random.randrange(1 << 30),
                )
            )

        probe(min(args.cpu_rate, 50.0), 3.0)  # warm-up: lazy imports, caches, connections
        counts_before = ranker_counts(metrics) if metrics else (0.0, 0.0)
        at_rate = probe(args.cpu_rate, args.cpu_s)
        counts_after = ranker_counts(metrics) if metrics else (0.0, 0.0)
        executions = counts_after[1] - counts_before[1]
        batching = (
            round((counts_after[0] - counts_before[0]) / executions, 2) if executions else None
        )
        log(
            f"  {config}: at {args.cpu_rate:g} req/s p99 {at_rate.p99_ms} ms, CPU-ms per "
            f"request {at_rate.cpu_ms_per_request}"
            + (f", {batching} ranker requests per Triton execution" if batching else "")
        )
        log(f"  {config}: searching the highest rate with p99 <= {args.slo_ms:g} ms")
        rate, probes = search_rate(
            probe, args.slo_ms, args.start_rate, args.step, args.bisections, args.search_s, log
        )
    log(f"  {config}: {rate} req/s within the SLO")
    return {
        "config": config,
        "slo_rate_rps": rate,
        "cpu_rate_rps": args.cpu_rate,
        "cpu_ms_per_request": at_rate.cpu_ms_per_request,
        "ranker_requests_per_execution": batching,
        "at_cpu_rate": asdict(at_rate),
        "probes": [asdict(p) for p in probes],
    }


def run_catalog(name: str, args: argparse.Namespace) -> dict:
    root = ensure_release(name)
    rng = random.Random(1)
    known = user_ids(root)
    sample = [
        rng.choice(known) if rng.random() > 0.05 else 10**9 + i for i in range(args.floor_requests)
    ]
    log(f"{name}: compute floor over {len(sample)} requests ...")
    floor = compute_floor(root, sample, args.k)
    log(
        f"{name}: floor {floor['floor_cpu_ms_per_request']} CPU-ms per request "
        f"(LightGBM {floor['lightgbm_cpu_ms_per_request']})"
    )
    runs = {c: run_config(c, root, known, args) for c in args.configs}
    total = floor["floor_cpu_ms_per_request"]
    return {
        "catalog": name,
        "items": int(np.load(sorted((root / "releases").glob("*/item_ids.npy"))[-1]).shape[0]),
        "k": args.k,
        "slo_ms": args.slo_ms,
        **floor,
        "runs": runs,
        "cpu_to_floor_ratio": {
            c: round(r["cpu_ms_per_request"]["servers_total"] / total, 2) for c, r in runs.items()
        },
    }


def capacity(catalog: dict, http: Probe, cores: int) -> dict[str, dict[str, float]]:
    """Per configuration, what the machine's cores allow: the CPU-ms per request they give at
    the target rate, what the compute floor, the load generator (measured on that
    configuration's requests) and the bare HTTP server take of it, what is left for
    everything else (the gateway's own work, Triton, Redis, and the idle time a p99 needs),
    and two rates at which the cores would be fully busy: with the stack as measured, and
    with nothing but the floor, the load generator and the bare HTTP server."""
    floor = catalog["floor_cpu_ms_per_request"]
    http_ms = http.cpu_ms_per_request["http_server"]
    out = {}
    for config, run in catalog["runs"].items():
        measured = run["cpu_ms_per_request"]
        generator = measured["load_generator"]
        budget = cores * 1000 / TARGET_RPS[config]
        out[config] = {
            "target_rps": TARGET_RPS[config],
            "cpu_ms_per_request_at_target": round(budget, 3),
            "floor": floor,
            "load_generator": generator,
            "bare_http_server": http_ms,
            "left_for_the_rest": round(budget - floor - generator - http_ms, 3),
            "saturation_rps_as_measured": round(
                cores * 1000 / (measured["servers_total"] + generator), 1
            ),
            "saturation_rps_no_overhead": round(cores * 1000 / (floor + generator + http_ms), 1),
        }
    return out


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """The module docstring as written, and every option's default."""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--catalogs", nargs="+", choices=list(CATALOGS), default=["synthetic"])
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    parser.add_argument("--slo-ms", type=float, default=50.0, help="p99 latency objective")
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--workers", type=int, default=1, help="gateway (uvicorn) processes")
    parser.add_argument("--cpu-rate", type=float, default=120.0, help="rate of the CPU probe")
    parser.add_argument("--cpu-s", type=float, default=10.0, help="seconds of the CPU probe")
    parser.add_argument("--start-rate", type=float, default=60.0, help="first rate searched")
    parser.add_argument("--step", type=float, default=1.5, help="step-up factor of the search")
    parser.add_argument("--bisections", type=int, default=4, help="bisection probes at most")
    parser.add_argument("--probe-s", type=float, default=8.0, help="seconds per search probe")
    parser.add_argument("--search-s", type=float, default=150.0, help="time budget per search")
    parser.add_argument("--floor-requests", type=int, default=1000, help="floor loop length")
    parser.add_argument(
        "--protocol", choices=["http", "grpc"], default="http", help="full stack: to Triton"
    )
    parser.add_argument(
        "--query-tower",
        choices=["gateway", "triton"],
        default="gateway",
        help="full stack: where the query tower runs (CASCADE_TRITON__QUERY_TOWER)",
    )
    parser.add_argument(
        "--embedding-rows",
        choices=list(EMBEDDING_ROWS),
        default="auto",
        help="full stack: the ranker's DLRM rows in memory when they fit the budget, else "
        "through the cache (auto, the default settings); always the cache; always in memory",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="short probes (3 s), 2 bisections, 40 s per search, 300 floor requests",
    )
    args = parser.parse_args()
    if args.quick:
        args.probe_s, args.cpu_s, args.bisections = 3.0, 4.0, 2
        args.search_s, args.floor_requests = 40.0, 300
    catalogs = [run_catalog(name, args) for name in args.catalogs]
    log(f"HTTP floor: a bare ASGI app on the gateway's uvicorn options at {args.cpu_rate:g} req/s")
    http = measure_http_floor(args.cpu_rate, args.cpu_s, wait_for, stop)
    log(f"  bare HTTP server: CPU-ms per request {http.cpu_ms_per_request}, p99 {http.p99_ms} ms")
    cores = os.cpu_count() or 1
    for catalog in catalogs:
        catalog["capacity"] = capacity(catalog, http, cores)
    for catalog in catalogs:
        for config, run in catalog["runs"].items():
            log(
                f"{catalog['catalog']:>9} {config:>8}: {run['slo_rate_rps']:7.1f} req/s at p99 <= "
                f"{args.slo_ms:g} ms; {run['cpu_ms_per_request']['servers_total']:.2f} CPU-ms/req "
                f"= {catalog['cpu_to_floor_ratio'][config]}x the floor "
                f"({catalog['floor_cpu_ms_per_request']}); load generator "
                f"{run['cpu_ms_per_request']['load_generator']} CPU-ms/req (excluded)"
            )
            room = catalog["capacity"][config]
            log(
                f"{catalog['catalog']:>9} {config:>8}: at {room['target_rps']:g} req/s {cores} "
                f"cores give {room['cpu_ms_per_request_at_target']:.2f} CPU-ms/req; floor "
                f"{room['floor']} + load generator {room['load_generator']} + bare HTTP "
                f"{room['bare_http_server']} leave {room['left_for_the_rest']:.2f} for the rest; "
                f"cores saturated at {room['saturation_rps_as_measured']} req/s as measured, "
                f"{room['saturation_rps_no_overhead']} with no overhead at all"
            )
    main_catalog = catalogs[-1]
    result = {
        "benchmark": "serving",
        "catalog": main_catalog["catalog"],
        "slo_ms": args.slo_ms,
        "slo_rate_rps": {c: r["slo_rate_rps"] for c, r in main_catalog["runs"].items()},
        "cpu_ms_per_request": {
            c: r["cpu_ms_per_request"]["servers_total"] for c, r in main_catalog["runs"].items()
        },
        "cpu_ms_per_request_by_process": {
            c: r["cpu_ms_per_request"] for c, r in main_catalog["runs"].items()
        },
        "floor_cpu_ms_per_request": main_catalog["floor_cpu_ms_per_request"],
        "cpu_to_floor_ratio": main_catalog["cpu_to_floor_ratio"],
        "bare_http": asdict(http),
        "capacity": main_catalog["capacity"],
        "catalogs": catalogs,
    }
    publish("serving", result)


if __name__ == "__main__":
    main()
