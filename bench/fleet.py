"""Benchmark: the serving fleet (issue 35) with 1 and 2 replicas on this box.

The shape of ``tests/integration/fleet_shape.py``: each replica is ``cascade serve --triton``
(a gateway with its own Triton on loopback, the sidecar shape), one Redis for all, versions
1 (production) and 2 of a small synthetic release. For each replica count it measures

- open-loop load (``bench/openloop.py``: Poisson arrivals, latency from each request's
  scheduled time) split evenly over the replicas, as a load balancer would: CPU-ms per
  request of every server process (gateways, tritonservers, python stubs, Redis) at one
  fixed rate for both counts, the scaling measure on a box whose cores bound the rate
  (it must not grow with replicas), and the highest rate whose p99 stays within the SLO
  (the p99 of the fleet is taken as the worst replica's: an upper bound);
- convergence, every replica timed from the moment the desired state changes to its report
  of ``converged`` on that revision (its Triton serves the versions, checked): a rollout
  step (canary 2 at 50 %), a Triton killed with SIGKILL on one replica (to its Triton
  serving production again, and to converged: the gateway's supervisor restarts it empty,
  the reconcile loop loads production and canary in one call), and a rollback (the canary
  unloaded).

The follower runs at its default interval (1 s). Progress goes to stdout; the last line is
one JSON object (also bench/results/fleet.json), with the 2-replica figures as ratios to the
1-replica ones of the same run.

    python bench/fleet.py [--replicas 1 2] [--quick | --convergence-only]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
from openloop import (
    Probe,
    ProcessGroup,
    children,
    cpu_seconds,
    open_loop,
    search_rate,
    triton_processes,
)
from publish import publish

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pipelines.config import TrainConfig
from pipelines.pipeline import run_pipeline
from tests.integration.fleet_shape import Fleet, Replica, fleet, fleet_export

SIZE = (1000, 1000, 50_000)  # synthetic users, items, interactions
TRAIN = TrainConfig(two_tower_epochs=3, bpr_epochs=1, dlrm_epochs=2, gbm_rounds=50)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def replica_groups(stack: Fleet) -> list[ProcessGroup]:
    """One process group per replica: its gateway, its tritonserver and stubs; Redis with
    the first (so that summing the replicas counts it once)."""
    groups = []
    for number, replica in enumerate(stack.replicas):
        group = ProcessGroup()
        group.add("gateway", replica.process.pid)
        triton = replica.triton_pid()
        assert triton is not None, "a replica without its Triton"
        triton_processes(group, triton)
        if number == 0:
            group.add("redis", stack.redis_pid)
        groups.append(group)
    return groups


async def fleet_probe(
    stack: Fleet, groups: list[ProcessGroup], users: list[int], rate: float, seconds: float
) -> Probe:
    """``rate`` requests/s split evenly over the replicas, as one probe: requests, errors
    and degraded answers summed, CPU per request over all requests, p50/p99 the worst
    replica's (the fleet's p99 is at most that)."""
    share = rate / len(stack.replicas)
    seed = random.randrange(1 << 30)
    own = time.process_time()
    probes = await asyncio.gather(
        *(
            open_loop(f"{r.url}/v1/recommend", users, share, seconds, 20, g, seed=seed + i)
            for i, (r, g) in enumerate(zip(stack.replicas, groups, strict=True))
        )
    )
    own = time.process_time() - own
    sent = sum(p.sent for p in probes)
    cpu: dict[str, float] = {}
    for probe in probes:
        for name, value in probe.cpu_ms_per_request.items():
            if name not in ("servers_total", "load_generator"):
                cpu[name] = cpu.get(name, 0.0) + value * probe.sent / max(sent, 1)
    cpu = {name: round(value, 3) for name, value in cpu.items()}
    cpu["servers_total"] = round(sum(cpu.values()), 3)
    cpu["load_generator"] = round(own * 1000 / max(sent, 1), 3)
    return Probe(
        rate=round(rate, 1),
        sent=sent,
        p50_ms=max(p.p50_ms for p in probes),
        p99_ms=max(p.p99_ms for p in probes),
        errors=sum(p.errors for p in probes),
        degraded=sum(p.degraded for p in probes),
        lag_p99_ms=max(p.lag_p99_ms for p in probes),
        stage_p50_ms=probes[0].stage_p50_ms,
        cpu_ms_per_request=cpu,
    )


def idle_cpu_ms_per_s(groups: list[ProcessGroup], seconds: float) -> float:
    """CPU-ms per second the servers spend with no traffic (follower ticks, Triton, Redis):
    a cost per replica, not per request, that a low request rate spreads thin."""
    before = [group.sample() for group in groups]
    time.sleep(seconds)
    after = [group.sample() for group in groups]
    spent = sum(sum(a.values()) - sum(b.values()) for a, b in zip(after, before, strict=True))
    return round(spent * 1000 / seconds, 2)


def converged_on(replica: Replica, revision: int) -> bool:
    try:
        code, body = replica.readiness()
    except httpx.HTTPError:
        return False
    status = body.get("rollout") or {}
    return code == 200 and status.get("applied_revision") == revision and status["converged"]


def time_convergence(
    stack: Fleet, revision: int, since: float, timeout_s: float = 180.0
) -> list[float]:
    """Seconds from ``since`` until each replica reports converged on ``revision``."""
    done: dict[int, float] = {}
    deadline = time.monotonic() + timeout_s
    while len(done) < len(stack.replicas):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"replicas {sorted(set(range(len(stack.replicas))) - set(done))} "
                f"did not converge on revision {revision} in {timeout_s:.0f} s"
            )
        for number, replica in enumerate(stack.replicas):
            if number not in done and converged_on(replica, revision):
                done[number] = round(time.monotonic() - since, 2)
        time.sleep(0.05)
    return [done[n] for n in range(len(stack.replicas))]


def time_until(condition: Any, since: float, timeout_s: float = 180.0) -> float:
    """Seconds from ``since`` until ``condition()`` is true (polled every 50 ms)."""
    while not condition():
        if time.monotonic() - since > timeout_s:
            raise RuntimeError(f"not within {timeout_s:.0f} s")
        time.sleep(0.05)
    return round(time.monotonic() - since, 2)


def triton_cpu(replica: Replica) -> dict[int, float]:
    """CPU-seconds so far of the replica's tritonserver (with its exited children's: stubs
    that only completed a config) and of each process under it (its python stubs), by pid."""
    server = replica.triton_pid()
    if server is None:
        return {}
    found = {pid: cpu_seconds(pid) for pid in children(server)}
    try:
        fields = Path(f"/proc/{server}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return found
    reaped = (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")  # cutime, cstime
    return {**found, server: cpu_seconds(server) + reaped}


def cpu_spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU-seconds the processes alive in ``after`` spent since ``before`` (new ones: all)."""
    return round(sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items()), 2)


def change_desired(stack: Fleet, **changes: Any) -> tuple[int, float]:
    """Write the next desired state; returns its revision and when it was written."""
    current = stack.state.read()
    assert current is not None
    state = stack.state.write(current.next(**changes), current.revision)
    return state.revision, time.monotonic()


def convergence(stack: Fleet) -> dict[str, Any]:
    """The three convergence timings of the module docstring, and the CPU-seconds the first
    replica's Triton and stubs spent on the first two (what a quiet box's time follows)."""
    first = stack.replicas[0]
    before = triton_cpu(first)
    revision, since = change_desired(
        stack, canary=2, canary_weight=0.5, step=0, assignment_salt="bench", reason="bench step"
    )
    loaded = time_until(lambda: all(r.triton_serves(2) for r in stack.replicas), since)
    step = time_convergence(stack, revision, since)
    step_cpu = cpu_spent(before, triton_cpu(first))
    log(
        f"    rollout step (canary 2 at 50 %): every Triton serves it after {loaded} s, "
        f"converged after {step} s ({step_cpu} CPU-s on the first replica's Triton)"
    )
    replica = stack.replicas[0]
    killed = replica.kill_triton()
    since = time.monotonic()
    triton_back = time_until(
        lambda: replica.triton_pid() not in (None, killed) and replica.triton_serves(1), since
    )
    restart = time_convergence(stack, revision, since)[0]
    restart_cpu = cpu_spent({}, triton_cpu(replica))  # a new tritonserver, new stubs
    log(
        f"    Triton SIGKILL: answering again after {triton_back} s, converged after {restart} s "
        f"({restart_cpu} CPU-s)"
    )
    revision, since = change_desired(stack, canary=None, canary_weight=0.0, reason="bench rollback")
    rollback = time_convergence(stack, revision, since)
    log(f"    rollback (canary unloaded): converged after {rollback} s")
    return {
        "rollout_step_triton_serves_canary_s": loaded,
        "rollout_step_s": step,
        "rollout_step_max_s": max(step),
        "rollout_step_triton_cpu_s": step_cpu,
        "triton_restart_answering_s": triton_back,
        "triton_restart_converged_s": restart,
        "triton_restart_cpu_s": restart_cpu,
        "reconcile_after_answering_s": round(restart - triton_back, 2),
        "rollback_s": rollback,
    }


def run_fleet(count: int, root: Path, directory: Path, users: list[int], args: Any) -> dict:
    log(f"{count} replica(s): starting ...")
    started = time.monotonic()
    with fleet(root, directory / f"fleet-{count}", count, CASCADE_FOLLOW__INTERVAL_S="1") as stack:
        log(f"  ready after {time.monotonic() - started:.1f} s")
        result: dict[str, Any] = {"replicas": count}
        if not args.convergence_only:
            result |= serving(stack, users, args)
        log("  convergence:")
        result["convergence"] = convergence(stack)
    return result


def serving(stack: Fleet, users: list[int], args: Any) -> dict[str, Any]:
    """CPU per request at one rate, idle CPU, and the highest rate within the SLO."""
    groups = replica_groups(stack)

    def probe(rate: float, seconds: float | None = None) -> Probe:
        return asyncio.run(fleet_probe(stack, groups, users, rate, seconds or args.probe_s))

    probe(min(args.cpu_rate, 10.0), 3.0)  # warm-up: lazy imports, connections
    idle = idle_cpu_ms_per_s(groups, args.idle_s)
    at_rate = probe(args.cpu_rate, args.cpu_s)
    total = at_rate.cpu_ms_per_request["servers_total"]
    net = round(total - idle / args.cpu_rate, 3)
    log(
        f"  idle: {idle} CPU-ms per second (all replicas: followers, Tritons, Redis); at "
        f"{args.cpu_rate:g} req/s: p99 {at_rate.p99_ms} ms, degraded {at_rate.degraded}/"
        f"{at_rate.sent}, CPU-ms per request {at_rate.cpu_ms_per_request}, {net} net of idle"
    )
    log(f"  searching the highest rate with p99 <= {args.slo_ms:g} ms")
    rate, probes = search_rate(
        probe, args.slo_ms, args.start_rate, args.step, args.bisections, args.search_s, log
    )
    log(f"  {rate} req/s within the SLO")
    return {
        "slo_rate_rps": rate,
        "cpu_rate_rps": args.cpu_rate,
        "cpu_ms_per_request": at_rate.cpu_ms_per_request,
        "idle_cpu_ms_per_s": idle,
        "cpu_ms_per_request_net_of_idle": net,
        "at_cpu_rate": asdict(at_rate),
        "probes": [asdict(p) for p in probes],
    }


def serving_ratios(runs: dict[int, dict]) -> dict[str, dict[str, float | None]]:
    """Each replica count's CPU per request and SLO rate as ratios to the fewest replicas'."""
    base = runs[min(runs)]
    return {
        str(n): {
            "cpu_ms_per_request": round(
                r["cpu_ms_per_request"]["servers_total"]
                / base["cpu_ms_per_request"]["servers_total"],
                3,
            ),
            "cpu_ms_per_request_net_of_idle": round(
                r["cpu_ms_per_request_net_of_idle"] / base["cpu_ms_per_request_net_of_idle"], 3
            ),
            "slo_rate_rps": round(r["slo_rate_rps"] / base["slo_rate_rps"], 3)
            if base["slo_rate_rps"]
            else None,
        }
        for n, r in runs.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replicas", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--slo-ms", type=float, default=50.0, help="p99 latency objective")
    parser.add_argument("--cpu-rate", type=float, default=40.0, help="rate of the CPU probe")
    parser.add_argument("--idle-s", type=float, default=10.0, help="seconds of the idle probe")
    parser.add_argument("--cpu-s", type=float, default=15.0, help="seconds of the CPU probe")
    parser.add_argument("--start-rate", type=float, default=10.0, help="first rate searched")
    parser.add_argument("--step", type=float, default=1.5, help="step-up factor of the search")
    parser.add_argument("--bisections", type=int, default=3, help="bisection probes at most")
    parser.add_argument("--probe-s", type=float, default=6.0, help="seconds per search probe")
    parser.add_argument("--search-s", type=float, default=120.0, help="time budget per search")
    parser.add_argument("--quick", action="store_true", help="3 s probes, 40 s per search")
    parser.add_argument(
        "--convergence-only",
        action="store_true",
        help="only the convergence timings (no load probes): a few minutes",
    )
    args = parser.parse_args()
    if args.quick:
        args.probe_s, args.cpu_s, args.search_s, args.bisections = 3.0, 6.0, 40.0, 1
    if sorted(set(args.replicas)) != sorted(args.replicas) or min(args.replicas) < 1:
        parser.error("--replicas: distinct counts of at least 1")
    directory = Path(tempfile.mkdtemp(prefix="cascade-bench-fleet-"))
    try:
        log(f"training and exporting version 1 on synthetic data {SIZE}, then its twin 2")
        run_pipeline(
            directory / "v1" / "work",
            directory / "v1",
            TRAIN,
            dataset="synthetic",
            synthetic_size=SIZE,
            log=lambda _: None,
        )
        root = fleet_export(directory / "v1", directory / "artifacts", TRAIN)
        users_file = root / "releases" / "1" / "online" / "users.parquet"
        users = pd.read_parquet(users_file)["user_id"].astype(int).tolist()
        runs = {n: run_fleet(n, root, directory, users, args) for n in args.replicas}
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    record: dict[str, Any] = {
        "benchmark": "fleet",
        "cores": len(os.sched_getaffinity(0)),
        "load_average": os.getloadavg(),
        "runs": {str(n): r for n, r in runs.items()},
    }
    line: dict[str, Any] = {
        "benchmark": "fleet",
        "load_average_1m": round(os.getloadavg()[0], 2),
        "convergence_s": {
            str(n): {
                "rollout_step_max": r["convergence"]["rollout_step_max_s"],
                "rollout_step_triton_serves_canary": r["convergence"][
                    "rollout_step_triton_serves_canary_s"
                ],
                "triton_restart": r["convergence"]["triton_restart_converged_s"],
                "rollout_step_triton_cpu_s": r["convergence"]["rollout_step_triton_cpu_s"],
                "triton_restart_cpu_s": r["convergence"]["triton_restart_cpu_s"],
                "reconcile_after_triton_answers": r["convergence"]["reconcile_after_answering_s"],
                "rollback_max": max(r["convergence"]["rollback_s"]),
            }
            for n, r in runs.items()
        },
    }
    if not args.convergence_only:
        ratios = serving_ratios(runs)
        record |= {"slo_ms": args.slo_ms, "ratios_to_fewest_replicas": ratios}
        line |= {
            "slo_ms": args.slo_ms,
            "slo_rate_rps": {str(n): r["slo_rate_rps"] for n, r in runs.items()},
            "cpu_ms_per_request": {
                str(n): r["cpu_ms_per_request"]["servers_total"] for n, r in runs.items()
            },
            "cpu_ms_per_request_net_of_idle": {
                str(n): r["cpu_ms_per_request_net_of_idle"] for n, r in runs.items()
            },
            "idle_cpu_ms_per_s": {str(n): r["idle_cpu_ms_per_s"] for n, r in runs.items()},
            "cpu_rate_rps": args.cpu_rate,
            "ratios_to_fewest_replicas": ratios,
        }
    publish("fleet", record, line)


if __name__ == "__main__":
    main()
