"""The whole monitoring loop with the real parts (issue 11): a gateway (embedded stack) under
simulated users, a real Prometheus scraping it with the repository's rules (``for:`` and the
drift minimum sample shortened so it takes seconds), a real Alertmanager with the
repository's routing posting to the gateway's webhook.

1. Stationary traffic for as long as the shifted phase: no retraining alert, nothing queued.
2. The simulator shifts the user population (only users aged 50 and over): PSI of the user
   age rises, CascadeFeatureDrift fires, Alertmanager calls the webhook (and keeps re-sending),
   and exactly one retrain request is queued; a worker claims exactly one.

Every dashboard panel's query is checked in ``test_dashboards.py`` (the full stack).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from control.simulator import Preferences, SimulationPlan, population, simulate
from pipelines.data.synthetic import make_synthetic
from services.settings import Settings
from services.state.retrain_queue import FileRetrainQueue
from tests.conftest import EXPORTED_SIZE
from tests.integration.monitoring_servers import (
    Alertmanager,
    Prometheus,
    alertmanager_config_for_tests,
    require_binary,
    rules_for_tests,
    wait_until,
)
from tests.integration.served_app import (
    export_copy_with_admin_token,
    retrain_decisions,
    served_app,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
DATASET = EXPORTED_SIZE  # what the `exported` fixture trained on (seed 0)
TOKEN = "loop-admin-token"
PHASE_S = 12.0  # each phase's traffic; the drift window is 10 s
MIN_SAMPLES = 150  # the drift alerts' minimum sample in this test (production: 1000)


@pytest.fixture
def gateway(exported: Path, tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    """The gateway on a copy of the export with a short drift window; its admin token in a
    file. Yields its URL, the token file and its artifacts root."""
    artifacts, token_file = export_copy_with_admin_token(exported, tmp_path, TOKEN)
    settings = Settings(
        artifacts=artifacts,
        admin={"token_file": token_file},
        drift={"window_s": 10, "sub_windows": 5, "export_interval_s": 0.5},
        triton={"timeout_ms": 5000},  # a busy test machine must not degrade (unscored) answers
    )
    with served_app(settings) as url:
        yield url, token_file, artifacts


def _traffic(url: str, to: str) -> None:
    dataset = make_synthetic(*DATASET, seed=0)
    plan = SimulationPlan(url=url, rate=30, duration_s=PHASE_S, k=10, concurrency=4, seed=7)
    report = asyncio.run(simulate(plan, population(dataset, to), Preferences(dataset)))
    assert report.errors == 0, report.table()


def _retrain_alerts(prometheus: Prometheus) -> list[dict]:
    return [a for a in prometheus.alerts() if a["labels"].get("action") == "retrain"]


def test_a_population_shift_queues_exactly_one_retrain_and_stationary_traffic_none(
    gateway: tuple[str, Path, Path],
    tmp_path: Path,
    prometheus_server: Callable[..., Prometheus],
    alertmanager_server: Callable[..., Alertmanager],
) -> None:
    require_binary("prometheus")
    url, token_file, artifacts = gateway
    queue = FileRetrainQueue(artifacts / "retrain" / "queue.json")
    alertmanager = alertmanager_server(
        alertmanager_config_for_tests(f"{url}/v1/admin/alerts", token_file)
    )
    prometheus = prometheus_server(
        targets={"cascade": [url.removeprefix("http://")]},
        rule_files=rules_for_tests(
            tmp_path / "rules", for_="3s", thresholds={"drift_min_samples": MIN_SAMPLES}
        ),
        alertmanager=alertmanager.url,
    )
    wait_until(prometheus.targets_up, 30, "Prometheus to scrape the gateway")
    # the counter is per process: other tests may have counted
    before = retrain_decisions(url)
    enqueued_before = before["enqueued"]

    # 1. stationary traffic: PSI stays low, nothing fires, nothing is queued
    _traffic(url, "all")
    sampled = prometheus.query('cascade_drift_samples{feature="user_age"}')
    assert sampled and float(sampled[0]["value"][1]) >= MIN_SAMPLES, sampled
    assert _retrain_alerts(prometheus) == []
    assert queue.requests() == [] and retrain_decisions(url)["enqueued"] == enqueued_before

    # 2. the population shifts: the age PSI rises, the alert fires, one retrain is queued
    _traffic(url, "old")
    firing = wait_until(
        lambda: [a for a in _retrain_alerts(prometheus) if a["state"] == "firing"],
        60,
        "a retraining alert to fire",
    )
    assert "CascadeFeatureDrift" in {a["labels"]["alertname"] for a in firing}
    drifted = {a["labels"].get("feature") for a in firing}
    assert "user_age" in drifted, drifted
    wait_until(lambda: queue.requests() or None, 30, "the webhook to queue a retrain")
    # Alertmanager re-sends every 2 s here (and other drift alerts may join): two re-sends
    # answered as duplicates, not queued
    wait_until(
        lambda: retrain_decisions(url)["duplicate"] >= before["duplicate"] + 2,
        30,
        "the webhook to get two re-sends",
    )
    assert len(queue.requests()) == 1 and retrain_decisions(url)["enqueued"] == enqueued_before + 1
    claimed = queue.claim("test-worker", lease_s=60)
    assert claimed is not None and queue.claim("other-worker", lease_s=60) is None
