"""Closed-loop rollout scenarios (issue 10): real gateways follow the desired state in a real
Redis, simulated users click by the synthetic generator's latent truth, and the rollout
controller decides on what the gateways logged, with time compressed.

Scenarios (each from a clean registry and rollout record, on the same stack):

1. ``better``   a well-trained candidate against a weakened production -> promoted;
2. ``worse``    a forced candidate with shuffled item embeddings -> rolled back before 50 %;
3. ``aa``       candidate identical to production, repeated: rollbacks counted per reason;
4. ``no_traffic`` a trickle of traffic -> held, ends at the deadline: ``inconclusive`` (answers
   came, too few to decide), ``no_traffic`` only when an arm got no answer at all;
5. ``resume``   the controller is killed mid-rollout, a new one resumes and finishes;
6. ``triton``   on a real Triton, the candidate's ranker cannot load -> aborted
                (``canary_load_failed``), production serving throughout.

Every answer is checked: HTTP 200, its ``model_versions`` agree, and the impression log holds
the same version for its request id. Scenarios 1-5 run the models in process (LocalBackend);
the scenario-6 gateway scores on a Triton server from the nvidia-pytriton wheel. Prints one
table per scenario and, as its last line, one JSON object (also ``bench/results/rollout.json``)::

    .venv/bin/python bench/rollout.py                 # all scenarios, 20 A/A repetitions
    .venv/bin/python bench/rollout.py --only worse,triton --aa-repetitions 0
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

# the repository (when run as a script) and this directory (when imported as bench.rollout)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from publish import publish

from control.registry import RedisRegistry
from control.rollout.analysis import AnalysisConfig
from control.rollout.controller import RolloutController, RolloutPlan
from control.rollout.state import RedisRolloutLog, RolloutRecord
from control.simulator import KEEPALIVE_S, Preferences, population, position_bias
from pipelines.config import TrainConfig
from pipelines.data.schema import RawDataset
from pipelines.pipeline import load_dataset, run_pipeline
from services.serving.gateway import Gateway
from services.state.desired_state import DesiredState, RedisDesiredState
from services.stores.redis import RedisStore
from services.util.local_redis import free_port, start_redis_server

SIZE = (1000, 1000, 100_000)  # synthetic users, items, interactions
TRAIN = TrainConfig(two_tower_epochs=5, bpr_epochs=1, dlrm_epochs=4, gbm_rounds=100, eval_users=200)
GOOD, WEAK, BAD, TWIN = 1, 2, 3, 4  # the versions `build` exports, in this order
NAMESPACE = "cascade"  # the gateways' namespace: desired state, streams
ANALYSIS = AnalysisConfig(non_inferiority_margin=0.2, min_impressions=1000, min_requests=300)
PLAN = RolloutPlan(
    weights=(0.2, 0.35, 0.5),
    min_step_s=4.0,
    interval_s=0.5,
    step_deadline_s=40.0,
    analysis=ANALYSIS,
)


# -- versions ---------------------------------------------------------------------------


def build(root: Path, size: tuple[int, int, int] = SIZE, config: TrainConfig = TRAIN) -> None:
    """Train once and export four versions: good, weakened (80 % of the item embeddings
    shuffled), bad (all shuffled) and a twin of the good one. Each goes through the export
    step, so its manifest's sha256 table is the project's own."""
    quiet = lambda _: None  # noqa: E731
    run_pipeline(root / "work", root, config, dataset="synthetic", synthetic_size=size, log=quiet)
    path = root / "work" / "models" / "item_embeddings.npy"
    good = np.load(path)
    rng = np.random.default_rng(0)
    for fraction in (0.8, 1.0, 0.0):
        embeddings = good.copy()
        rows = rng.choice(len(good), int(fraction * len(good)), replace=False)
        embeddings[rows] = good[rng.permutation(rows)]
        np.save(path, embeddings)
        run_pipeline(root / "work", root, config, steps=("export",), log=quiet)
    np.save(path, good)


def truth(size: tuple[int, int, int] = SIZE, config: TrainConfig = TRAIN) -> RawDataset:
    return load_dataset("synthetic", config.seed, size)


# -- the gateway, in a thread -----------------------------------------------------------

FEEDBACK_KEY = "bench-feedback-key"  # the simulated users' client key


def gateway_settings(
    root: Path, redis_url: str, triton_url: str | None = None, control_key: str | None = None
) -> Any:
    from pydantic import SecretStr

    from services.settings import (
        EmbeddingCacheSettings,
        FeedbackSettings,
        FollowSettings,
        RedisSettings,
        Settings,
        TritonSettings,
    )

    return Settings(
        artifacts=root,
        redis=RedisSettings(url=redis_url, timeout_ms=300, namespace=NAMESPACE),
        triton=TritonSettings(
            url=triton_url,
            timeout_ms=3000,
            control_key=SecretStr(control_key) if control_key else None,
        ),
        embedding_cache=EmbeddingCacheSettings(enabled=False),  # whole tables in memory
        follow=FollowSettings(interval_s=0.2, retire_after_s=2.0, keep_previous_s=5.0),
        candidates=100,
        feedback=FeedbackSettings(keys=[SecretStr(FEEDBACK_KEY)]),
    )


@contextlib.contextmanager
def serving(settings: Any) -> Iterator[tuple[str, Gateway]]:
    """A gateway (uvicorn, its own event loop in a thread) on a free port: (url, gateway)."""
    import uvicorn

    from services.api.app import create_app
    from services.api.server import server_config

    gateway = Gateway(settings)
    port = free_port()
    server = uvicorn.Server(server_config(create_app(gateway=gateway), "127.0.0.1", port, settings))
    thread = threading.Thread(target=server.run, daemon=True, name="gateway")
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the gateway did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", gateway
    finally:
        server.should_exit = True
        thread.join(timeout=30)


# -- simulated users ----------------------------------------------------------------------


@dataclass
class Traffic:
    """Every answer a simulated user got, and what was wrong with any of them."""

    answers: dict[str, int] = field(default_factory=dict)  # request_id -> served version
    shown: dict[str, tuple[int, list[int]]] = field(default_factory=dict)  # -> (user, items)
    statuses: Counter[int] = field(default_factory=Counter)
    transport_errors: Counter[str] = field(default_factory=Counter)  # per exception class
    mixed: int = 0  # answers whose query_tower / ranker / release versions disagree
    feedback_non_200: int = 0  # feedback posts that failed even after the client's retries
    feedback_retries: int = 0
    # asked but still waiting for one of the client's connections when the users stopped: a
    # stack slower than the asked rate builds this backlog, which is dropped, not drained
    unsent: int = 0
    clicks: int = 0
    degraded: Counter[str] = field(default_factory=Counter)  # answers per degraded reason
    latencies_ms: list[float] = field(default_factory=list)  # as the client saw each answer
    seconds: float = 0.0  # how long the users asked

    def pace(self) -> dict[str, float]:
        """Answers per second over the run and the client-side latency quantiles: a stack
        slowing down over repetitions shows here, not only in the time to a decision."""
        latencies = np.asarray(self.latencies_ms or [np.nan])
        return {
            "answers_per_s": round(len(self.answers) / self.seconds, 1) if self.seconds else 0.0,
            "latency_p50_ms": round(float(np.percentile(latencies, 50)), 1),
            "latency_p99_ms": round(float(np.percentile(latencies, 99)), 1),
        }

    @property
    def non_200(self) -> int:
        return sum(n for status, n in self.statuses.items() if status != 200)


async def users_clicking(
    url: str,
    users: np.ndarray,
    preferences: Preferences,
    rate: float,
    stop: asyncio.Event,
    traffic: Traffic,
    seed: int = 0,
    k: int = 10,
    concurrency: int = 16,
) -> None:
    """Ask for answers at ``rate`` until ``stop``; click by the ground truth (as ``cascade
    simulate`` does) and keep every answer for the checks."""
    rng = np.random.default_rng(seed)
    gate = asyncio.Semaphore(concurrency)
    bias = position_bias(k)

    async def one(http: httpx.AsyncClient, user_id: int, draws: np.ndarray) -> None:
        async with gate:
            if stop.is_set():  # asked while all connections were busy: never sent
                traffic.unsent += 1
                return
            asked = time.perf_counter()
            try:
                answer = await http.post("/v1/recommend", json={"user_id": user_id, "k": k})
            except httpx.HTTPError as error:
                traffic.transport_errors[type(error).__name__] += 1
                return
            traffic.latencies_ms.append((time.perf_counter() - asked) * 1e3)
            traffic.statuses[answer.status_code] += 1
            if answer.status_code != 200:
                return
            body = answer.json()
            versions = body["model_versions"]
            if len({versions["query_tower"], versions["ranker"], versions["release"]}) != 1:
                traffic.mixed += 1
            traffic.answers[body["request_id"]] = int(versions["release"])
            for reason in body["reasons"] if body["degraded"] else ():
                traffic.degraded[reason] += 1
            items = np.asarray([i["item_id"] for i in body["items"]], np.int64)
            traffic.shown[body["request_id"]] = (user_id, items.tolist())
            relevance = preferences.relevance(user_id, items)
            clicked = items[draws[: len(items)] < bias[: len(items)] * relevance]
            if len(clicked) == 0:
                return
            events = [
                {
                    "user_id": user_id,
                    "item_id": int(item),
                    "type": "click",
                    "request_id": body["request_id"],
                    "event_id": f"bench-{body['request_id']}-{int(item)}",
                }
                for item in clicked
            ]
            traffic.clicks += len(events)
            # as a client should: a 503 (Redis slow or away, nothing stored) or a lost
            # connection is retried with the same event ids, which the gateway stores once
            for attempt, backoff_s in enumerate((0.2, 0.5, None)):
                try:
                    sent = await http.post("/v1/feedback", json={"events": events})
                    status: int | None = sent.status_code
                except httpx.HTTPError:
                    status = None
                if status == 200:
                    break
                if backoff_s is None or status not in (None, 503):
                    traffic.feedback_non_200 += 1
                    break
                traffic.feedback_retries += 1
                await asyncio.sleep(backoff_s * (attempt + 1))

    # idle connections dropped well before the gateway's keep-alive closes them, as `cascade
    # simulate` does: at equal timeouts a request can go out on a connection the server is
    # closing at that moment, and fail without an answer (a client's error, not the gateway's)
    limits = httpx.Limits(keepalive_expiry=KEEPALIVE_S)
    headers = {"Authorization": f"Bearer {FEEDBACK_KEY}"}
    async with httpx.AsyncClient(
        base_url=url, timeout=10.0, limits=limits, headers=headers
    ) as http:
        tasks: set[asyncio.Task[None]] = set()
        started, number = time.monotonic(), 0
        while not stop.is_set():
            delay = started + number / rate - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                continue
            user_id = int(users[rng.integers(len(users))])
            task = asyncio.create_task(one(http, user_id, rng.random(k)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            number += 1
        await asyncio.gather(*tasks)
        traffic.seconds = time.monotonic() - started


async def logged_versions(store: RedisStore, after: str) -> list[tuple[str, str, int]]:
    """(stream id, request_id, model_version) of every impression set logged after ``after``."""
    logged: list[tuple[str, str, int]] = []
    while True:
        entries = await store.read_stream("impressions", after, 10_000)
        for stream_id, fields in entries:
            after = stream_id
            logged.append((stream_id, fields["request_id"], int(fields["model_version"])))
        if len(entries) < 10_000:
            return logged


def _stream_id(value: str) -> tuple[int, int]:
    milliseconds, sequence = value.split("-")
    return int(milliseconds), int(sequence)


# -- one rollout ------------------------------------------------------------------------


@dataclass
class Stack:
    """What every scenario shares: the export root, the Redis, a gateway, the users."""

    root: Path
    redis_url: str
    gateway_url: str
    gateway: Gateway
    users: np.ndarray
    preferences: Preferences
    rate: float = 120.0
    plan: RolloutPlan = PLAN
    runs: int = 0


async def wait_applied(gateway: Gateway, state: DesiredState, timeout_s: float = 30.0) -> None:
    """Until the gateway routes by ``state`` (its follower applied the revision)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        follower = gateway.follower
        if follower is not None and (follower.applied_revision or 0) >= state.revision:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"the gateway did not apply desired revision {state.revision}")


def reset(stack: Stack, production: int) -> DesiredState:
    """Serve ``production`` alone (a new revision of the desired state)."""
    desired = RedisDesiredState(stack.redis_url, NAMESPACE)
    try:
        current = desired.read()
        if current is None:
            return desired.write(DesiredState(production=production, revision=1), 0)
        if current.production == production and current.canary is None:
            return current  # no new revision: nothing for the gateways to reload
        state = current.next(production=production, canary=None, canary_weight=0.0, step=0)
        return desired.write(state, current.revision)
    finally:
        desired.close()


async def rollout(
    stack: Stack,
    production: int,
    candidate: int,
    force: bool = False,
    rate: float | None = None,
    kill_after_step: int | None = None,
    plan: RolloutPlan | None = None,
    beside: Callable[[asyncio.Event, Traffic], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """One rollout of ``candidate`` against ``production`` under simulated traffic, from a
    fresh registry and rollout record; returns its summary (outcome, timing, arms, checks).
    ``beside`` runs with the simulated users until they stop (an attacker, say)."""
    plan = plan or stack.plan
    stack.runs += 1
    namespace = f"bench{stack.runs}"  # a fresh registry, rollout record and lock
    await wait_applied(stack.gateway, reset(stack, production), timeout_s=180.0)
    registry = RedisRegistry(stack.redis_url, namespace)
    registry.adopt(production, "bench: production")
    # a forced candidate is one the gate rejected, rolled out with --force
    registry.register(candidate, {"verdict": "fail" if force else "pass", "bench": True})
    store = RedisStore(stack.redis_url, NAMESPACE)
    await store.start()
    stop, traffic = asyncio.Event(), Traffic()
    first_id = f"{int(time.time() * 1000)}-0"
    load = asyncio.create_task(
        users_clicking(
            stack.gateway_url,
            stack.users,
            stack.preferences,
            rate or stack.rate,
            stop,
            traffic,
            seed=stack.runs,
        )
    )
    other = asyncio.create_task(beside(stop, traffic)) if beside is not None else None

    def controller() -> RolloutController:
        return RolloutController(
            stack.root,
            RedisRegistry(stack.redis_url, namespace),
            RedisDesiredState(stack.redis_url, NAMESPACE),
            RedisRolloutLog(stack.redis_url, namespace),
            store,
            plan,
        )

    seen: dict[str, Any] = {"canary_failed": set(), "problems": [], "routed_canary": False}
    watch = asyncio.create_task(_watch(stack.gateway, seen))
    started = time.monotonic()
    kills = 0
    first = controller()
    record = first.start(candidate, force=force)
    if kill_after_step is not None:
        task = asyncio.create_task(_drive(first, namespace))
        while not task.done():
            current = first.log.load()
            if current is not None and current.step >= kill_after_step:
                break
            await asyncio.sleep(0.1)
        task.cancel()  # killed mid-look or between looks: the lock stays until its ttl
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        kills += 1
        await asyncio.sleep(plan.interval_s * 2)
        second = controller()
        record = second.start(candidate, force=force)  # resumes the running rollout
        record = await _drive(second, namespace)
    else:
        record = await _drive(first, namespace)
    decided_s = time.monotonic() - started
    # answers keep coming until the gateway has applied the decision (a Triton gateway may
    # still be loading the canary the controller gave up on)
    desired = RedisDesiredState(stack.redis_url, NAMESPACE)
    final = desired.read()
    desired.close()
    if final is not None:
        await wait_applied(stack.gateway, final, timeout_s=180.0)
    await asyncio.sleep(1.0)
    stop.set()
    await load
    if other is not None:
        await other
    watch.cancel()
    await asyncio.sleep(1.0)  # the impression log's writer flushes
    logged = await logged_versions(store, first_id)
    audit = RedisRolloutLog(stack.redis_url, namespace).audit(10_000)
    await store.close()
    registry.close()
    result = summary(record, audit, traffic, logged, decided_s, kills)
    result["gateway"] = {
        "canary_failed": sorted(seen["canary_failed"]),
        "problems": seen["problems"],
        "canary_routed": seen["routed_canary"],
    }
    return result


async def _watch(gateway: Gateway, seen: dict[str, Any]) -> None:
    """What the gateway's follower reported during the rollout (problems, a failed canary)."""
    since: int | None = None  # the revision the follower had applied before this rollout
    while True:
        follower = gateway.follower
        if follower is not None:
            if since is None:
                since = follower.applied_revision or 0
            for applied in list(follower.history):  # kept: the rollback replaces the state
                if applied.revision <= since:
                    continue
                if applied.canary_failed is not None:
                    seen["canary_failed"].add(applied.canary_failed)
                for problem in applied.problems:
                    if problem not in seen["problems"]:
                        seen["problems"].append(problem)
            router = gateway.router
            seen["routed_canary"] |= router is not None and router.canary is not None
        await asyncio.sleep(0.1)


async def _drive(controller: RolloutController, namespace: str) -> RolloutRecord:
    """The controller's loop, holding its lock (short ttl, so that a killed one frees it)."""
    while True:
        try:
            with controller.registry.lock("rollout", ttl_s=3 * controller.plan.interval_s) as lock:
                return await controller.run(lock)
        except Exception as error:
            if "held by" not in str(error):
                raise
            await asyncio.sleep(controller.plan.interval_s)


def summary(
    record: RolloutRecord,
    audit: list[dict[str, Any]],
    traffic: Traffic,
    log: list[tuple[str, str, int]],
    decided_s: float,
    kills: int,
) -> dict[str, Any]:
    decisions: list[dict[str, Any]] = []  # runs of equal looks, then the steps and the end
    for entry in audit:
        if entry.get("rollout") != record.id:
            continue
        event = entry["event"]
        if event == "look":
            key = (entry["step"], entry["outcome"], entry["reason"])
            last = decisions[-1] if decisions else None
            if last and (last.get("step"), last.get("outcome"), last.get("reason")) == key:
                last["looks"] += 1
            else:
                decisions.append(
                    {
                        "step": entry["step"],
                        "weight": entry["weight"],
                        "outcome": entry["outcome"],
                        "reason": entry["reason"],
                        "looks": 1,
                    }
                )
        elif event in ("step", "promoted", "rolled_back"):
            decisions.append(
                {"event": event, "weight": entry["weight"], "reason": entry.get("reason", "")}
            )
    arms = {
        name: {
            "requests": arm.requests,
            "impressions": arm.impressions,
            "clicks": arm.clicks,
            "ctr": round(arm.clicks / arm.impressions, 4) if arm.impressions else None,
        }
        for name, arm in record.arms.items()
    }
    # what the controller counted against what the log holds up to its cursor
    cursor = _stream_id(record.cursors["impressions"])
    in_log = Counter(version for stream_id, _, version in log if _stream_id(stream_id) <= cursor)
    counted = {
        "control": record.arms["control"].requests if "control" in record.arms else 0,
        "canary": record.arms["canary"].requests if "canary" in record.arms else 0,
        "log_control": in_log[record.production],
        "log_canary": in_log[record.version],
    }
    logged = {rid: version for _, rid, version in log}
    unlogged = [rid for rid in traffic.answers if rid not in logged]
    log_mismatch = sum(logged[rid] != v for rid, v in traffic.answers.items() if rid in logged)
    return {
        "outcome": record.status,
        "reason": record.reason,
        "version": record.version,
        "production": record.production,
        "forced": record.forced,
        "time_to_decision_s": round(decided_s, 1),
        "max_weight": max(record.weights[: record.step + 1]),
        "looks": record.looks,
        "arms": arms,
        "decisions": decisions,
        "controller_kills": kills,
        "answers": len(traffic.answers),
        "non_200": traffic.non_200 + sum(traffic.transport_errors.values()),
        "statuses": {str(k): v for k, v in traffic.statuses.items()},
        "transport_errors": dict(traffic.transport_errors),
        "unsent": traffic.unsent,
        "degraded": dict(traffic.degraded),
        "mixed_versions": traffic.mixed + log_mismatch,
        "unlogged_answers": len(unlogged),
        "counted_vs_log": counted,
        "feedback_non_200": traffic.feedback_non_200,
        "feedback_retries": traffic.feedback_retries,
        "served": dict(Counter(str(v) for v in traffic.answers.values())),
        **traffic.pace(),
    }


# -- scenarios --------------------------------------------------------------------------


async def scenario_better(stack: Stack) -> dict[str, Any]:
    return await rollout(stack, WEAK, GOOD)


async def scenario_worse(stack: Stack) -> dict[str, Any]:
    return await rollout(stack, GOOD, BAD, force=True)


async def scenario_no_traffic(stack: Stack) -> dict[str, Any]:
    return await rollout(stack, GOOD, TWIN, rate=1.0)


async def scenario_resume(stack: Stack) -> dict[str, Any]:
    return await rollout(stack, WEAK, GOOD, kill_after_step=1)


async def scenario_aa(stack: Stack, repetitions: int) -> dict[str, Any]:
    runs = []
    for repetition in range(1, repetitions + 1):
        run = await rollout(stack, GOOD, TWIN)
        runs.append(run)
        ctr = {arm: counts["ctr"] for arm, counts in sorted(run["arms"].items())}
        print(
            f"   aa {repetition}/{repetitions}: {run['outcome']} ({run['reason']}) after "
            f"{run['time_to_decision_s']} s; {run['answers_per_s']} answers/s, client p99 "
            f"{run['latency_p99_ms']} ms; last step's CTR {ctr}",
            flush=True,
        )
    outcomes = Counter(f"{r['outcome']}:{r['reason']}" for r in runs)
    false_kpi = sum(
        r["outcome"] == "rolled_back"
        and r["reason"] in ("kpi_worse", "error_rate", "degraded_rate", "latency", "srm")
        for r in runs
    )
    return {
        "repetitions": repetitions,
        "outcomes": dict(outcomes),
        "false_rollbacks": false_kpi,
        "false_rollback_rate": round(false_kpi / repetitions, 3) if repetitions else None,
        "deadline_rollbacks": outcomes.get("rolled_back:no_traffic", 0)
        + outcomes.get("rolled_back:inconclusive", 0),
        "time_to_decision_s": [r["time_to_decision_s"] for r in runs],
        "answers_per_s": [r["answers_per_s"] for r in runs],
        "latency_p99_ms": [r["latency_p99_ms"] for r in runs],
        "arms": [r["arms"] for r in runs],
        "non_200": sum(r["non_200"] for r in runs),
        "statuses": dict(sum((Counter(r["statuses"]) for r in runs), Counter())),
        "transport_errors": dict(sum((Counter(r["transport_errors"]) for r in runs), Counter())),
        "mixed_versions": sum(r["mixed_versions"] for r in runs),
        "unlogged_answers": sum(r["unlogged_answers"] for r in runs),
        "answers": sum(r["answers"] for r in runs),
    }


def triton_repository(root: Path, into: Path, versions: tuple[int, ...]) -> Path:
    """Triton's own copy of the export (what syncing a model volume puts there), holding
    ``versions``: releases (the sha256 tables) and both models' version directories."""
    for version in versions:
        shutil.copytree(root / "releases" / str(version), into / "releases" / str(version))
        for model in ("query_tower", "ranker"):
            source = root / "model_repository" / model
            target = into / "model_repository" / model
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(source / "config.pbtxt", target / "config.pbtxt")
            shutil.copytree(source / str(version), target / str(version))
    return into / "model_repository"


def corrupt(path: Path) -> None:
    """Same size, one byte off: the file no longer matches its manifest's sha256."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


@contextlib.asynccontextmanager
async def on_triton(stack: Stack, directory: Path) -> AsyncIterator[Stack]:
    """A Triton server whose copy of version TWIN has a corrupted ranker, and a gateway
    scoring on it; yields the stack with that gateway."""
    from services.inference.triton_server import TritonServer

    base = Path(tempfile.mkdtemp(dir=directory, prefix="triton-"))
    repository = triton_repository(stack.root, base, (GOOD,))
    server = TritonServer(
        repository,
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        log_file=base / "tritonserver.log",
    )
    await asyncio.to_thread(server.start, 180.0)
    try:
        triton_repository(stack.root, base, (TWIN,))  # the candidate lands on Triton's volume
        corrupt(repository / "ranker" / str(TWIN) / "dlrm_dense.onnx")
        reset(stack, GOOD)
        settings = gateway_settings(
            stack.root, stack.redis_url, server.http_url, server.control_key
        )
        with serving(settings) as (url, gateway):
            yield Stack(
                stack.root,
                stack.redis_url,
                url,
                gateway,
                stack.users,
                stack.preferences,
                stack.rate,
                stack.plan,
                stack.runs,
            )
    finally:
        await asyncio.to_thread(server.stop)


EXPECTED = {
    "better": ("promoted", "kpi_pass"),
    "worse": ("rolled_back", None),
    "no_traffic": ("rolled_back", None),  # inconclusive, or no_traffic without answers
    "resume": ("promoted", "kpi_pass"),
    "triton": ("rolled_back", "canary_load_failed"),
}


def judge(name: str, result: dict[str, Any]) -> bool:
    """Did the scenario end as it must, with every answer clean?"""
    clean = result["non_200"] == 0 and result["mixed_versions"] == 0
    if name == "aa":
        return clean and result["false_rollbacks"] <= 0.05 * result["repetitions"]
    outcome, reason = EXPECTED[name]
    ok = result["outcome"] == outcome and reason in (None, result["reason"])
    if name == "worse":
        ok = ok and result["reason"] == "kpi_worse" and result["max_weight"] < 0.5
    if name == "no_traffic":
        answered = result["arms"].get("canary", {}).get("requests", 0) > 0
        ok = ok and result["reason"] == ("inconclusive" if answered else "no_traffic")
    if name == "resume":
        ok = ok and result["controller_kills"] == 1
    return clean and ok


def table(name: str, result: dict[str, Any]) -> str:
    if name == "aa":
        return (
            f"== aa: {result['repetitions']} repetitions, outcomes {result['outcomes']}, "
            f"false rollbacks {result['false_rollbacks']}, non-200 {result['non_200']}, "
            f"mixed {result['mixed_versions']}, answers {result['answers']}"
        )
    lines = [
        f"== {name}: version {result['version']} vs production {result['production']}"
        f"{' (forced)' if result['forced'] else ''} -> {result['outcome']} ({result['reason']}) "
        f"after {result['time_to_decision_s']} s, {result['looks']} looks, "
        f"max weight {result['max_weight']:.0%}",
        f"   {'arm':<8} {'requests':>8} {'shown':>7} {'clicks':>6} {'ctr':>7}",
    ]
    for arm, counts in sorted(result["arms"].items()):
        ctr = "-" if counts["ctr"] is None else f"{counts['ctr']:.4f}"
        lines.append(
            f"   {arm:<8} {counts['requests']:>8} {counts['impressions']:>7} "
            f"{counts['clicks']:>6} {ctr:>7}"
        )
    for decision in result["decisions"]:
        if "event" in decision:
            lines.append(
                f"   -> {decision['event']} at {decision['weight']:.0%} {decision['reason']}"
            )
        else:
            lines.append(
                f"   step {decision['step']} ({decision['weight']:.0%}): {decision['outcome']} "
                f"({decision['reason']}) x{decision['looks']}"
            )
    lines.append(
        f"   answers {result['answers']}, non-200 {result['non_200']} (statuses "
        f"{result['statuses']}, transport errors {result['transport_errors']}), mixed versions "
        f"{result['mixed_versions']}, unlogged {result['unlogged_answers']}, degraded "
        f"{result['degraded']}, served {result['served']}",
    )
    gateway = result["gateway"]
    if gateway["canary_failed"] or gateway["problems"]:
        lines.append(f"   gateway: canary_failed {gateway['canary_failed']}")
        lines.extend(f"   gateway problem: {problem[:160]}" for problem in gateway["problems"])
    return "\n".join(lines)


SCENARIOS = ("better", "worse", "aa", "no_traffic", "resume", "triton")


async def exported(directory: Path) -> Path:
    """The four versions under ``directory/export``, trained unless a run left them there."""
    root = directory / "export"
    if not (root / "releases" / str(TWIN) / "manifest.json").is_file():
        print(f"training, exporting 4 versions ({SIZE[0]} users, {SIZE[1]} items)", flush=True)
        await asyncio.to_thread(build, root)
    return root


@contextlib.contextmanager
def private_redis(directory: Path) -> Iterator[str]:
    """A fresh Redis with AOF on a free port, desired state: production GOOD; its URL."""
    redis_dir = Path(tempfile.mkdtemp(dir=directory, prefix="redis-"))
    redis_url, redis = start_redis_server(redis_dir, persist=True)
    try:
        desired = RedisDesiredState(redis_url, NAMESPACE)
        desired.write(DesiredState(production=GOOD, revision=1), 0)
        desired.close()
        yield redis_url
    finally:
        redis.terminate()
        redis.wait(timeout=10)


@contextlib.contextmanager
def served_stack(root: Path, redis_url: str, rate: float, dataset: RawDataset) -> Iterator[Stack]:
    """A gateway following ``redis_url``'s desired state, with ``dataset``'s users who ask it
    at ``rate`` (the stack object outlives the gateway: scenario 6 reuses it)."""
    with serving(gateway_settings(root, redis_url)) as (url, gateway):
        stack = Stack(
            root, redis_url, url, gateway, population(dataset, "all"), Preferences(dataset)
        )
        stack.rate = rate
        yield stack


async def run_all(directory: Path, only: tuple[str, ...], repetitions: int, rate: float) -> dict:
    started = time.monotonic()
    root = await exported(directory)
    built_s = time.monotonic() - started
    results: dict[str, Any] = {}
    with private_redis(directory) as redis_url:
        with served_stack(root, redis_url, rate, truth()) as stack:
            for name in only:
                if name == "triton":
                    continue
                if name == "aa":
                    if repetitions <= 0:
                        continue
                    result = await scenario_aa(stack, repetitions)
                else:
                    result = await globals()[f"scenario_{name}"](stack)
                result["ok"] = judge(name, result)
                results[name] = result
                print(table(name, result), flush=True)
        if "triton" in only:  # one gateway follows at a time: the in-process one has stopped
            async with on_triton(stack, directory) as triton_stack:
                result = await rollout(triton_stack, GOOD, TWIN)
            result["ok"] = judge("triton", result)
            results["triton"] = result
            print(table("triton", result), flush=True)
    return {
        "plan": {
            "weights": list(PLAN.weights),
            "interval_s": PLAN.interval_s,
            "min_step_s": PLAN.min_step_s,
            "step_deadline_s": PLAN.step_deadline_s,
            "non_inferiority_margin": ANALYSIS.non_inferiority_margin,
            "min_impressions": ANALYSIS.min_impressions,
            "min_requests": ANALYSIS.min_requests,
            "alpha": ANALYSIS.alpha,
            "rate_per_s": rate,
        },
        "build_s": round(built_s, 1),
        "wall_s": round(time.monotonic() - started, 1),
        "all_ok": all(r["ok"] for r in results.values()),
        "scenarios": results,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(SCENARIOS), help="scenarios, comma-separated")
    parser.add_argument("--aa-repetitions", type=int, default=20, help="A/A rollouts")
    parser.add_argument("--rate", type=float, default=120.0, help="simulated requests per second")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="keep (and reuse) the trained export here"
    )
    args = parser.parse_args()
    only = tuple(s for s in args.only.split(",") if s)
    unknown = set(only) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; choose from {SCENARIOS}")
    with contextlib.ExitStack() as cleanup:
        directory = args.workdir or Path(
            cleanup.enter_context(tempfile.TemporaryDirectory(prefix="cascade-rollout-"))
        )
        directory.mkdir(parents=True, exist_ok=True)
        record = asyncio.run(run_all(directory, only, args.aa_repetitions, args.rate))
    # the per-repetition arms of the A/A runs stay in the file, not on the last line
    line = json.loads(json.dumps(record))
    if "aa" in line["scenarios"]:
        line["scenarios"]["aa"].pop("arms")
    publish("rollout", record, line)
    return 0 if record["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
