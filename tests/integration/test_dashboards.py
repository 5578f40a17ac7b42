"""Every dashboard panel has data (issue 11), on the production shape: a gateway scoring on a
real Triton (the ranker's embedding rows through the hierarchical cache, backed by a real
Redis), a rollout of a second version running under ``cascade rollout --metrics-port`` (a
separate process, as in the CronJob), simulated users clicking, and a real Prometheus with
the repository's rules scraping the gateway, Triton's metrics port and the controller.

Each panel's queries are read over the test's time range (the drift window and the rollout's
gauges come and go with the traffic); a panel with no series in any of its queries fails the
test, and so does a threshold line (``cascade:threshold:*``) with no value.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from pipelines.config import TrainConfig
from pipelines.data.synthetic import make_synthetic
from pipelines.pipeline import run_pipeline
from services.control.desired_state import DesiredState, RedisDesiredState
from services.control.registry import RedisRegistry
from services.embedding_cache.backing import RedisRows
from services.local_redis import free_port, start_redis_server
from services.materialize import materialize_embeddings
from services.monitoring.panels import all_panels
from services.settings import FollowSettings, RedisSettings, Settings, TritonSettings
from services.simulator import Preferences, SimulationPlan, population, simulate
from services.triton_server import TritonServer, TritonUnavailable, wheel_directory
from tests.conftest import EXPORTED_SIZE, EXPORTED_TRAINING
from tests.integration.monitoring_servers import Prometheus, rules_for_tests, wait_until
from tests.integration.served_app import served_app

pytestmark = [pytest.mark.integration, pytest.mark.slow]
NAMESPACE = "cascade"  # gateway, controller and the ranker's cache share the defaults
TRAFFIC_S = 30.0


@pytest.fixture
def two_versions(exported: Path, tmp_path: Path) -> Path:
    """A copy of the export root holding version 1 and a twin, version 2 (the same trained
    models through the export step again: its own manifest, a candidate to roll out)."""
    root = tmp_path / "artifacts"
    shutil.copytree(exported, root)
    run_pipeline(
        root / "work", root, TrainConfig(**EXPORTED_TRAINING), steps=("export",), log=lambda _: 0
    )
    assert (root / "releases" / "2" / "manifest.json").is_file()
    return root


@pytest.fixture
def redis_with_state(two_versions: Path, tmp_path: Path) -> Iterator[str]:
    """A private Redis (AOF) holding both versions' embedding rows, the desired state
    (production 1) and the registry (1 production, 2 a candidate the gate passed)."""
    (tmp_path / "redis").mkdir()
    try:
        url, process = start_redis_server(tmp_path / "redis", persist=True)
    except FileNotFoundError:
        pytest.skip("redis-server is not installed")
    try:
        rows = RedisRows(url, NAMESPACE, timeout_s=5.0)
        for version in (1, 2):
            materialize_embeddings(rows, two_versions / "model_repository", version)
        rows.close()
        desired = RedisDesiredState(url, NAMESPACE)
        desired.write(DesiredState(production=1, revision=1), 0)
        desired.close()
        registry = RedisRegistry(url, NAMESPACE)
        registry.adopt(1, "test: production")
        registry.register(2, {"verdict": "pass", "test": "dashboards"})
        registry.close()
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def triton(two_versions: Path, redis_with_state: str, tmp_path: Path) -> Iterator[TritonServer]:
    try:
        wheel_directory()
    except TritonUnavailable as error:
        pytest.skip(f"Triton cannot run here: {error}")
    server = TritonServer(
        two_versions / "model_repository",
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        log_file=tmp_path / "triton" / "tritonserver.log",
        env={"CASCADE_REDIS__URL": redis_with_state},
    )
    server.start(timeout_s=180)
    try:
        yield server
    finally:
        server.stop()


def _rollout_controller(
    root: Path, redis_url: str, metrics_port: int, log: Path
) -> subprocess.Popen:
    """``cascade rollout 2`` with its metrics port: one 50 % step judged every second."""
    command = [
        sys.executable,
        "-m",
        "services.cli",
        "rollout",
        "2",
        "--artifacts",
        str(root),
        "--steps",
        "0.5",
        "--interval-s",
        "1",
        "--min-step-s",
        "10",
        "--step-deadline-s",
        "600",
        "--min-impressions",
        "200",
        "--min-requests",
        "50",
        "--metrics-port",
        str(metrics_port),
    ]
    env = {**os.environ, "CASCADE_REDIS__URL": redis_url, "CASCADE_REDIS__NAMESPACE": NAMESPACE}
    return subprocess.Popen(command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def test_every_panel_has_data_on_the_full_stack_during_a_rollout(
    two_versions: Path,
    redis_with_state: str,
    triton: TritonServer,
    tmp_path: Path,
    prometheus_server: Callable[..., Prometheus],
) -> None:
    settings = Settings(
        artifacts=two_versions,
        redis=RedisSettings(url=redis_with_state, timeout_ms=300, namespace=NAMESPACE),
        triton=TritonSettings(
            url=triton.http_url,
            # Loading the canary (Triton starts its python stubs, the gateway loads its
            # release) takes the 2 cores of a test machine for seconds: production's requests
            # then wait. Such answers come back degraded (scoring:timeout) within the
            # simulator's 5 s.
            timeout_ms=1000,
            control_key=SecretStr(triton.control_key),
        ),
        follow=FollowSettings(interval_s=0.2, retire_after_s=2.0, keep_previous_s=5.0),
        drift={"window_s": 10, "sub_windows": 5, "export_interval_s": 0.5},
    )
    controller_log = tmp_path / "rollout.log"
    metrics_port = free_port()
    with served_app(settings) as url:
        controller = _rollout_controller(
            two_versions, redis_with_state, metrics_port, controller_log
        )
        try:
            prometheus = prometheus_server(
                targets={
                    "cascade": [url.removeprefix("http://")],
                    "triton": [f"127.0.0.1:{triton.metrics_port}"],
                    "cascade-rollout": [f"127.0.0.1:{metrics_port}"],
                },
                rule_files=rules_for_tests(tmp_path / "rules", for_="3s"),
            )
            wait_until(prometheus.targets_up, 60, "Prometheus to scrape all three targets")
            started = time.time()
            dataset = make_synthetic(*EXPORTED_SIZE, seed=0)
            plan = SimulationPlan(
                url=url, rate=30, duration_s=TRAFFIC_S, k=10, concurrency=4, seed=11
            )
            report = asyncio.run(simulate(plan, population(dataset, "all"), Preferences(dataset)))
            assert report.errors == 0, report.table()
            time.sleep(3.0)  # the last scrapes and rule evaluations
        finally:
            controller.terminate()
            controller.wait(timeout=30)
    output = controller_log.read_text()
    assert "version 2 against production 1" in output, output
    assert "Traceback" not in output, output

    def over_the_test(expr: str) -> list:
        return prometheus.get(
            "/api/v1/query_range", query=expr, start=started, end=time.time(), step=1
        )["result"]

    empty, no_threshold = [], []
    for dashboard, panel in all_panels():
        if not any(over_the_test(query.expr) for query in panel.queries):
            empty.append(f"{dashboard.uid}: {panel.title} ({panel.needs})")
        no_threshold += [t.series for t in panel.thresholds if not over_the_test(t.series)]
    assert empty == [], f"panels without data: {empty}\ncontroller:\n{output}"
    assert no_threshold == [], f"threshold series without a value: {no_threshold}"
