"""Open-loop load for the serving benchmark: Poisson arrivals on a schedule, latency measured
from each request's scheduled time (so queueing in the client or the server is not hidden),
a search for the highest rate whose p99 stays within the SLO, and CPU time per process read
from /proc (robust to other load on the machine).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np

STAGES = ("features", "retrieval", "filtering", "scoring", "ordering")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SETTLE_S = 0.3


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (0.0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc/<pid>/task/*/children)."""
    found: list[int] = []
    tasks = Path(f"/proc/{pid}/task")
    if not tasks.is_dir():
        return found
    for task in tasks.iterdir():
        try:
            direct = [int(p) for p in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
        for child in direct:
            found += [child, *children(child)]
    return found


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError):
        return ""


@dataclass
class ProcessGroup:
    """Named server processes whose CPU is sampled together."""

    pids: dict[str, list[int]] = field(default_factory=dict)

    def add(self, name: str, pid: int) -> None:
        self.pids.setdefault(name, []).append(pid)

    def sample(self) -> dict[str, float]:
        return {name: sum(cpu_seconds(p) for p in pids) for name, pids in self.pids.items()}


def triton_processes(group: ProcessGroup, server_pid: int) -> None:
    """tritonserver itself and its python-backend stubs, one name per model."""
    group.add("tritonserver", server_pid)
    for child in children(server_pid):
        line = command_line(child)
        if "triton_python_backend_stub" not in line:
            continue
        model = next((m for m in ("query_tower", "ranker") if f"/{m}/" in line), "other")
        group.add(f"stub_{model}", child)


def ranker_counts(metrics_url: str) -> tuple[float, float]:
    """(requests, executions) of the ranker so far, from Triton's metrics port."""
    import urllib.request

    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    totals = {"nv_inference_request_success": 0.0, "nv_inference_exec_count": 0.0}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name in totals and 'model="ranker"' in rest:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals["nv_inference_request_success"], totals["nv_inference_exec_count"]


@dataclass
class Probe:
    """One open-loop run at a fixed rate."""

    rate: float
    sent: int
    p50_ms: float
    p99_ms: float
    errors: int
    degraded: int
    lag_p99_ms: float  # how late the generator sent (its own queueing), for the record
    stage_p50_ms: dict[str, float]
    cpu_ms_per_request: dict[str, float]

    def meets(self, slo_ms: float) -> bool:
        """p99 within the SLO, no errors, and at most 1% degraded answers (a timed-out stage
        answers fast but worse: it must not pass as speed)."""
        return self.errors == 0 and self.degraded <= 0.01 * self.sent and self.p99_ms <= slo_ms


async def open_loop(
    url: str,
    users: Sequence[int],
    rate: float,
    duration_s: float,
    k: int,
    processes: ProcessGroup,
    seed: int = 0,
    timeout_s: float = 2.0,
) -> Probe:
    """Send POSTs with exponential inter-arrival times at ``rate`` per second for
    ``duration_s``; a request not answered within ``timeout_s`` counts as an error."""
    rng = random.Random(seed)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, int(rate * duration_s) + 1)
    schedule = np.cumsum(gaps)
    schedule = schedule[schedule < duration_s]
    latencies: list[float] = []
    lags: list[float] = []
    stage_ms: dict[str, list[float]] = {s: [] for s in STAGES}
    counts = {"errors": 0, "degraded": 0}
    timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def one(session: aiohttp.ClientSession, due: float, user: int) -> None:
        try:
            async with session.post(url, json={"user_id": user, "k": k}) as response:
                body = await response.json()
                ok = response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            ok = False
        if not ok:
            counts["errors"] += 1
            return
        latencies.append(time.perf_counter() - due)
        counts["degraded"] += bool(body["degraded"])
        for stage in STAGES:
            stage_ms[stage].append(body["timings_ms"].get(stage, 0.0))

    connector = aiohttp.TCPConnector(limit=2000)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = []
        cpu_before, own_before = processes.sample(), time.process_time()
        start = time.perf_counter()
        for offset in schedule:
            due = start + float(offset)
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            lags.append(time.perf_counter() - due)
            # 5% unknown users exercise the cold-start path
            user = rng.choice(users) if rng.random() > 0.05 else 10**9 + rng.randrange(1000)
            tasks.append(asyncio.create_task(one(session, due, user)))
        await asyncio.gather(*tasks)
        await asyncio.sleep(SETTLE_S)  # work still running after the answers (timed out)
        cpu_after, own_after = processes.sample(), time.process_time()
    sent = len(schedule)
    cpu = {n: (cpu_after[n] - cpu_before[n]) * 1000 / max(sent, 1) for n in cpu_after}
    cpu = {n: round(v, 3) for n, v in cpu.items()}
    cpu["servers_total"] = round(sum(cpu.values()), 3)
    cpu["load_generator"] = round((own_after - own_before) * 1000 / max(sent, 1), 3)
    ms = np.asarray(latencies) * 1000
    return Probe(
        rate=round(rate, 1),
        sent=sent,
        p50_ms=round(float(np.percentile(ms, 50)), 2) if len(ms) else float("inf"),
        p99_ms=round(float(np.percentile(ms, 99)), 2) if len(ms) else float("inf"),
        errors=counts["errors"],
        degraded=counts["degraded"],
        lag_p99_ms=round(float(np.percentile(lags, 99)) * 1000, 2) if lags else 0.0,
        stage_p50_ms={s: round(float(np.median(v)), 3) for s, v in stage_ms.items() if v},
        cpu_ms_per_request=cpu,
    )


def search_rate(
    probe: Callable[[float], Probe],
    slo_ms: float,
    start: float,
    step: float,
    bisections: int,
    budget_s: float,
    log: Callable[[str], None] = print,
) -> tuple[float, list[Probe]]:
    """The highest rate whose probe meets the SLO: step the rate up by ``step``x until one
    fails, then bisect between the last pass and the first fail; stops when ``budget_s``
    is spent. Returns (0.0, probes) when even ``start`` fails."""
    deadline = time.monotonic() + budget_s
    probes: list[Probe] = []

    def run(rate: float) -> bool:
        """A rate fails only when two probes in a row fail it: one p99 of a few seconds
        rests on a handful of requests, and a shared machine has spikes."""
        for attempt in range(2):
            result = probe(rate)
            probes.append(result)
            verdict = "ok" if result.meets(slo_ms) else "over"
            log(
                f"    {rate:7.1f} req/s: p50 {result.p50_ms:7.2f} ms  p99 {result.p99_ms:8.2f} ms"
                f"  errors {result.errors}  degraded {result.degraded}  server CPU "
                f"{result.cpu_ms_per_request['servers_total']:.2f} ms/req  {verdict}"
                + ("" if attempt == 0 else " (again)")
            )
            if result.meets(slo_ms):
                return True
        return False

    good, bad = 0.0, None
    rate = start
    while time.monotonic() < deadline:
        if not run(rate):
            bad = rate
            break
        good, rate = rate, rate * step
    for _ in range(bisections):
        if bad is None or time.monotonic() >= deadline or bad - good < max(5.0, 0.03 * bad):
            break
        middle = (good + bad) / 2
        if run(middle):
            good = middle
        else:
            bad = middle
    return round(good, 1), probes
