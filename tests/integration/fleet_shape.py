"""A serving fleet on loopback, for ``tests/integration/test_fleet.py`` and ``bench/fleet.py``.

The sidecar shape (docs/fleet.md): N gateway processes, each ``cascade serve --triton`` with
its own Triton on loopback (the gateway's supervisor restarts a Triton that dies, as the
kubelet restarts a sidecar container), one private Redis holding the desired state, the
registry (1 production, 2 a candidate the gate passed) and the replicas' reports (the
durable role), the ranker's embedding rows in it too or, with ``cache_cluster``, in a
3-node Redis Cluster (the cache role, docs/redis.md), and ``cascade rollout`` as a process
of its own.

- ``fleet_export(source, root, training)``: ``export_twin`` (versions 1 and 2) with the
  ranker's Triton config made to show what a restart does: one instance per version (the
  2 cores of a test box), and the version policy of the day it was deployed (production 1
  alone), so every Triton starts without the canary (the repository's default, ``latest
  2``, would serve both by chance here): what the replica needs beyond its default, the
  rollout and its reconcile loop have to load (a restarted Triton starts empty, see
  ``services.inference.triton_server``).
- ``fleet(root, directory, replicas)``: start it all; yields a ``Fleet``.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from control.registry import RedisRegistry
from control.rollout.state import RolloutLog, RolloutRecord, make_rollout_log
from pipelines.config import TrainConfig
from services.embedding_cache.backing import RedisRows
from services.state.desired_state import DesiredState, RedisDesiredState
from services.stores.materialize import materialize_embeddings
from services.util.local_redis import start_redis_server
from services.util.local_redis_cluster import start_redis_cluster
from tests.integration.production_shape import export_twin
from tests.integration.served_app import wait_until_ready

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "fleet"
ONE_INSTANCE = "instance_group [ { count: 1, kind: KIND_CPU } ]"
DEPLOYED_POLICY = "version_policy: { specific: { versions: [1] } }"
ROWS_NAMESPACE = "cascade"  # the embedding cache's default, what the ranker in Triton reads
ROLLOUT_OPTIONS = (
    *("--steps", "0.5", "--interval-s", "0.5", "--min-step-s", "600"),
    *("--step-deadline-s", "600", "--apply-deadline-s", "300"),
)


def fleet_export(source: Path, root: Path, training: TrainConfig) -> Path:
    """``export_twin`` with the ranker's Triton config of the module docstring."""
    export_twin(source, root, training)
    config = root / "model_repository" / "ranker" / "config.pbtxt"
    text = re.sub(r"instance_group \[[^\]]*\]", ONE_INSTANCE, config.read_text())
    config.write_text(re.sub(r"version_policy: \{.*\}", DEPLOYED_POLICY, text))
    return root


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return found


def _below_ephemeral(taken: set[int], count: int) -> int:
    """A port P with P .. P + count - 1 free, below the kernel's ephemeral range: a process
    that binds late (Triton binds after loading its models, seconds later on a busy box)
    cannot lose its port to an outgoing connection's local port meanwhile."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    while True:
        first = random.randrange(max(1024, low - 12_000), low - count)
        ports = set(range(first, first + count))
        if ports & taken:
            continue
        try:
            for port in ports:
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first


@dataclass
class Replica:
    """One gateway process and its Triton."""

    url: str
    process: subprocess.Popen[bytes]
    triton_port: int
    output: Path

    def triton_pid(self) -> int | None:
        """The tritonserver this gateway runs now (None between a death and its restart)."""
        for pid in _children(self.process.pid):
            try:
                if b"tritonserver" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return pid
            except OSError:
                continue
        return None

    def kill_triton(self) -> int:
        """SIGKILL its Triton (what an OOM kill or a node problem does); returns the pid."""
        pid = self.triton_pid()
        assert pid is not None, "no tritonserver runs under this gateway"
        os.kill(pid, signal.SIGKILL)
        return pid

    def readiness(self) -> tuple[int, dict[str, Any]]:
        response = httpx.get(f"{self.url}/health/ready", timeout=10)
        return response.status_code, response.json()

    def status(self) -> dict[str, Any]:
        """The follower's status (what it reports to the controller)."""
        rollout: dict[str, Any] = self.readiness()[1]["rollout"]
        return rollout

    def triton_serves(self, version: int, model: str = "ranker") -> bool:
        """Triton's own answer (its open readiness API), not the gateway's."""
        url = f"http://127.0.0.1:{self.triton_port}/v2/models/{model}/versions/{version}/ready"
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def metric(self, name: str, **labels: str) -> float:
        """A sample of this gateway's /metrics (0 when absent)."""
        wanted = name + (
            "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
        )
        for line in httpx.get(f"{self.url}/metrics", timeout=10).text.splitlines():
            if line.startswith(wanted + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def recommend(self, user_id: int, timeout_s: float = 10.0) -> httpx.Response:
        return httpx.post(
            f"{self.url}/v1/recommend", json={"user_id": user_id, "k": 10}, timeout=timeout_s
        )


@dataclass
class Fleet:
    root: Path
    redis_url: str
    redis_pid: int
    replicas: list[Replica]
    directory: Path
    env: dict[str, str]
    log: RolloutLog
    state: RedisDesiredState
    stack: ExitStack  # what stops it all

    def record(self) -> RolloutRecord | None:
        return self.log.load()

    def reports(self) -> dict[str, dict[str, Any]]:
        """The live replicas' last reports to the controller, by replica name."""
        return {str(r["replica"]): r for r in self.state.reports()}

    def rollout(self, version: int = 2, *options: str) -> subprocess.Popen[bytes]:
        """``cascade rollout VERSION`` (a step of 50 % that holds: no decision is reached)."""
        command = [sys.executable, "-m", "cli.main", "rollout", str(version)]
        command += ["--artifacts", str(self.root), *(options or ROLLOUT_OPTIONS)]
        with (self.directory / "rollout.log").open("ab") as log:
            process = subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=log, stderr=log)
        self.stack.callback(_stop, process)
        return process


def _redis(root: Path, directory: Path, stack: ExitStack) -> tuple[str, int]:
    directory.mkdir(parents=True, exist_ok=True)
    url, process = start_redis_server(directory, persist=True)

    def stop() -> None:
        process.terminate()
        process.wait(timeout=10)

    stack.callback(stop)
    desired = RedisDesiredState(url, NAMESPACE)
    desired.write(DesiredState(production=1, revision=1), 0)
    desired.close()
    registry = RedisRegistry(url, NAMESPACE)
    registry.adopt(1, "fleet: production")
    registry.register(2, {"verdict": "pass", "by": "fleet"})
    registry.close()
    return url, process.pid


def _rows(root: Path, url: str) -> None:
    """The ranker's embedding rows of versions 1 and 2 into the cache Redis at ``url``."""
    rows = RedisRows(url, ROWS_NAMESPACE, timeout_s=5.0)
    for version in (1, 2):
        materialize_embeddings(rows, root / "model_repository", version)
    rows.close()


def environment(
    root: Path, redis_url: str, cache_url: str | None = None, **extra: str
) -> dict[str, str]:
    """The gateways' and the controller's settings (CASCADE_*), on top of this process's:
    ``redis_url`` the durable Redis, ``cache_url`` the cache's (None: the same one)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CASCADE_REDIS__", "CASCADE_TRITON__", "CASCADE_FOLLOW__"))
    }
    env.update(
        CASCADE_ARTIFACTS=str(root),
        CASCADE_REDIS__URL=cache_url or redis_url,
        CASCADE_REDIS__DURABLE_URL=redis_url,
        CASCADE_REDIS__NAMESPACE=NAMESPACE,
        CASCADE_REDIS__TIMEOUT_MS="300",
        # loading a version takes the 2 cores of a test box for seconds: answers meanwhile
        # come back degraded (scoring:timeout) rather than wait
        CASCADE_TRITON__TIMEOUT_MS="1000",
        CASCADE_FOLLOW__INTERVAL_S="0.2",
        CASCADE_FOLLOW__RETIRE_AFTER_S="2",
        CASCADE_FOLLOW__KEEP_PREVIOUS_S="5",
        CASCADE_FEEDBACK__REQUIRE_DURABLE="false",
    )
    env.update(extra)
    return env


def start_replica(directory: Path, env: dict[str, str], taken: set[int]) -> Replica:
    """``cascade serve --triton`` on free loopback ports (not yet waited for)."""
    port = _below_ephemeral(taken, 1)
    triton_port = _below_ephemeral(taken | {port}, 3)
    taken |= {port, triton_port, triton_port + 1, triton_port + 2}
    directory.mkdir(parents=True, exist_ok=True)
    output = directory / "serve.log"
    with output.open("wb") as sink:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "cli.main", "serve", "--triton"),
                *("--port", str(port), "--triton-http-port", str(triton_port)),
            ],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    return Replica(f"http://127.0.0.1:{port}", process, triton_port, output)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a gateway stops its Triton), SIGKILL after 30 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def fleet(
    root: Path,
    directory: Path,
    replicas: int = 2,
    cache_cluster: bool = False,
    **settings: str,
) -> Iterator[Fleet]:
    """Start the Redis (and with ``cache_cluster`` a 3-node Redis Cluster for the cache) and
    ``replicas`` gateways with their Tritons (see the module docstring), and wait until every
    gateway is ready: its Triton serves production 1. ``settings``: more CASCADE_* variables.
    Stops it all on exit."""
    with ExitStack() as stack:
        redis_url, redis_pid = _redis(root, directory / "redis", stack)
        cache_url = None
        if cache_cluster:
            cluster = start_redis_cluster(directory / "cache-cluster")
            stack.callback(cluster.stop)
            cache_url = cluster.url
        _rows(root, cache_url or redis_url)
        env = environment(root, redis_url, cache_url, **settings)
        taken: set[int] = set()
        started = []
        for number in range(replicas):
            replica = start_replica(directory / f"gateway-{number}", env, taken)
            stack.callback(_stop, replica.process)
            started.append(replica)
        for replica in started:
            wait_until_ready(replica.process, replica.url, timeout_s=240, output=replica.output)
        log = make_rollout_log(redis_url, NAMESPACE, root)
        stack.callback(log.close)
        state = RedisDesiredState(redis_url, NAMESPACE)
        stack.callback(state.close)
        yield Fleet(root, redis_url, redis_pid, started, directory, env, log, state, stack)
