"""The production shape, started on loopback ports for tests and benchmarks that need every
metric source at once (``tests/integration/test_dashboards.py``, ``bench/dashboards.py``).

- ``export_twin(source, root, training)``: a copy of an export root (with its ``work``
  directory) plus a second version: the same trained models through the export step again
  (its own manifest), a candidate to roll out.
- ``production_shape(root, directory)``: a private Redis (AOF) holding both versions'
  embedding rows, the desired state (production 1) and the registry (2 a candidate the gate
  passed); a real Triton whose ranker reads its rows through the embedding cache on that
  Redis; a gateway scoring on that Triton and following the desired state; and
  ``cascade rollout 2 --metrics-port`` (a separate process, as in the CronJob) judging one
  50 % step every second. Yields the URLs and ``host:port`` scrape targets.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from control.registry import RedisRegistry
from pipelines.config import TrainConfig
from pipelines.pipeline import run_pipeline
from services.embedding_cache.backing import RedisRows
from services.inference.triton_server import TritonServer
from services.settings import FollowSettings, RedisSettings, Settings, TritonSettings
from services.state.desired_state import DesiredState, RedisDesiredState
from services.stores.materialize import materialize_embeddings
from services.util.local_redis import free_port, start_redis_server
from tests.integration.served_app import served_app

NAMESPACE = "cascade"  # gateway, controller and the ranker's cache share the defaults
ROLLOUT_OPTIONS = (
    *("--steps", "0.5", "--interval-s", "1", "--min-step-s", "10", "--step-deadline-s", "600"),
    *("--min-impressions", "200", "--min-requests", "50"),
)


# Twins already exported in this process, by (source, training): tests that start from the
# same session export copy this one instead of running the export step again.
_TWINS: dict[tuple[str, str], Path] = {}


def export_twin(source: Path, root: Path, training: TrainConfig) -> Path:
    """Copy the export root ``source`` (with ``work``) to ``root`` and export version 2 (or
    copy the twin that an earlier call of this process made from the same source)."""
    key = (str(source.resolve()), training.model_dump_json())
    pristine = _TWINS.get(key)
    if pristine is not None and pristine.is_dir():
        shutil.copytree(pristine, root)
        return root
    shutil.copytree(source, root)
    run_pipeline(root / "work", root, training, steps=("export",), log=lambda _: None)
    if not (root / "releases" / "2" / "manifest.json").is_file():
        raise RuntimeError(f"the export step did not write version 2 under {root}")
    keep = Path(tempfile.mkdtemp(prefix="cascade-twin-"))
    atexit.register(shutil.rmtree, keep, ignore_errors=True)
    shutil.copytree(root, keep / "twin")  # before the caller changes its copy
    _TWINS[key] = keep / "twin"
    return root


@dataclass
class Stack:
    url: str  # the gateway
    redis_url: str
    triton: TritonServer
    rollout: subprocess.Popen[bytes]
    rollout_log: Path
    rollout_metrics_port: int

    def scrape_targets(self) -> dict[str, list[str]]:
        """Prometheus jobs: the gateway, Triton's metrics port, the rollout controller."""
        return {
            "cascade": [self.url.removeprefix("http://")],
            "triton": [f"127.0.0.1:{self.triton.metrics_port}"],
            "cascade-rollout": [f"127.0.0.1:{self.rollout_metrics_port}"],
        }


def _redis_with_state(root: Path, directory: Path, stack: ExitStack) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    url, process = start_redis_server(directory, persist=True)

    def stop() -> None:
        process.terminate()
        process.wait(timeout=10)

    stack.callback(stop)
    rows = RedisRows(url, NAMESPACE, timeout_s=5.0)
    for version in (1, 2):
        materialize_embeddings(rows, root / "model_repository", version)
    rows.close()
    desired = RedisDesiredState(url, NAMESPACE)
    desired.write(DesiredState(production=1, revision=1), 0)
    desired.close()
    registry = RedisRegistry(url, NAMESPACE)
    registry.adopt(1, "production shape: production")
    registry.register(2, {"verdict": "pass", "by": "production shape"})
    registry.close()
    return url


def _rollout(root: Path, redis_url: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "cli.main", "rollout", "2", "--artifacts", str(root)]
    command += [*ROLLOUT_OPTIONS, "--metrics-port", str(port)]
    env = {**os.environ, "CASCADE_REDIS__URL": redis_url, "CASCADE_REDIS__NAMESPACE": NAMESPACE}
    return subprocess.Popen(command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


@contextmanager
def production_shape(root: Path, directory: Path, **gateway: Any) -> Iterator[Stack]:
    """Start everything (see the module docstring) for an export root holding versions 1 and
    2; ``gateway`` overrides the gateway's settings (e.g. ``drift``). Stops it all on exit.
    Raises FileNotFoundError without ``redis-server``, TritonUnavailable without Triton."""
    with ExitStack() as stack:
        redis_url = _redis_with_state(root, directory / "redis", stack)
        triton = TritonServer(
            root / "model_repository",
            http_port=free_port(),
            grpc_port=free_port(),
            metrics_port=free_port(),
            log_file=directory / "triton" / "tritonserver.log",
            # through the cache (and its metrics) even though these small tables would fit
            # the in-memory budget that production chooses by
            env={"CASCADE_REDIS__URL": redis_url, "CASCADE_EMBEDDING_CACHE__IN_MEMORY_MAX_MB": "0"},
        )
        triton.start(timeout_s=180)
        stack.callback(triton.stop)
        settings = Settings(
            artifacts=root,
            redis=RedisSettings(url=redis_url, timeout_ms=300, namespace=NAMESPACE),
            triton=TritonSettings(
                url=triton.http_url,
                # Loading the canary (Triton starts its python stubs, the gateway loads its
                # release) takes the 2 cores of a test machine for seconds: production's
                # requests then wait. Such answers come back degraded (scoring:timeout)
                # within a client's 5 s.
                timeout_ms=1000,
                control_key=SecretStr(triton.control_key),
            ),
            follow=FollowSettings(interval_s=0.2, retire_after_s=2.0, keep_previous_s=5.0),
            **gateway,
        )
        url = stack.enter_context(served_app(settings))
        port, log = free_port(), directory / "rollout.log"
        rollout = _rollout(root, redis_url, port, log)

        def stop_rollout() -> None:
            rollout.terminate()
            rollout.wait(timeout=30)

        stack.callback(stop_rollout)
        yield Stack(url, redis_url, triton, rollout, log, port)
