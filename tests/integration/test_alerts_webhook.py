"""Drift alert -> Alertmanager -> webhook -> one retrain request, with the real servers.

A tiny metrics endpoint exports the drift gauges the gateway exports (PSI with its sample
count); a real Prometheus scrapes it and evaluates the repository's rules (``for:`` shortened
to seconds); a real Alertmanager with the repository's routing (timings shortened, so it
re-sends every few seconds) posts to the webhook of a real gateway (uvicorn on a loopback
port, the admin token read from the same file Alertmanager sends it from). Exactly one retrain
request is queued however often Alertmanager re-sends; the resolved notification queues
nothing; a PSI over the threshold from too few samples raises no alert at all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from services.settings import Settings
from services.state.retrain_queue import FileRetrainQueue
from services.util.local_redis import free_port
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
TOKEN = "e2e-admin-token"


class DriftEndpoint:
    """``/metrics`` with the drift gauges, values set by the test."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_version", "feature"]
        self.psi = Gauge("cascade_drift_psi", "PSI", labels, registry=self.registry)
        self.samples = Gauge("cascade_drift_samples", "n", labels, registry=self.registry)
        self.port = free_port()
        self.server, self.thread = start_http_server(
            self.port, addr="127.0.0.1", registry=self.registry
        )

    def set(self, version: str, feature: str, psi: float, samples: int) -> None:
        self.psi.labels(version, feature).set(psi)
        self.samples.labels(version, feature).set(samples)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def drift() -> Iterator[DriftEndpoint]:
    endpoint = DriftEndpoint()
    yield endpoint
    endpoint.stop()


@pytest.fixture
def gateway(exported: Path, tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    """A real gateway (embedded default) on a copy of the export; its admin token in a file.
    Yields its URL, the token file and its artifacts root."""
    artifacts, token_file = export_copy_with_admin_token(exported, tmp_path, TOKEN)
    settings = Settings(artifacts=artifacts, admin={"token_file": token_file})
    with served_app(settings) as url:
        yield url, token_file, artifacts


def test_drift_alert_enqueues_exactly_one_retrain(
    drift: DriftEndpoint,
    gateway: tuple[str, Path, Path],
    tmp_path: Path,
    prometheus_server: Callable[..., Prometheus],
    alertmanager_server: Callable[..., Alertmanager],
) -> None:
    require_binary("prometheus")
    gateway_url, token_file, artifacts = gateway
    queue = FileRetrainQueue(artifacts / "retrain" / "queue.json")
    drift.set("3", "age", psi=0.4, samples=5000)  # drifted, with enough evidence
    drift.set("3", "occupation", psi=0.02, samples=5000)
    drift.set("3", "gender", psi=0.01, samples=5000)
    drift.set("3", "zip", psi=0.01, samples=5000)
    drift.set("4", "age", psi=0.9, samples=50)  # over the threshold, from too few samples
    before = retrain_decisions(gateway_url)

    alertmanager = alertmanager_server(
        alertmanager_config_for_tests(f"{gateway_url}/v1/admin/alerts", token_file)
    )
    prometheus = prometheus_server(
        targets={"cascade": [f"127.0.0.1:{drift.port}"]},
        rule_files=rules_for_tests(tmp_path / "rules", for_="2s"),
        alertmanager=alertmanager.url,
    )

    def firing() -> list[dict]:
        return [a for a in prometheus.alerts() if a["state"] == "firing"]

    fired = wait_until(firing, 60, "the drift alert to fire")
    assert {(a["labels"]["alertname"], a["labels"]["model_version"]) for a in fired} == {
        ("CascadeFeatureDrift", "3")
    }
    assert fired[0]["labels"]["feature"] == "age"
    assert fired[0]["labels"]["action"] == "retrain"

    # Alertmanager delivers it, then re-sends it every ~2 s: one request, the rest duplicates
    def resent() -> bool:
        seen = retrain_decisions(gateway_url)
        return seen["enqueued"] - before["enqueued"] >= 1 and (
            seen["duplicate"] - before["duplicate"] >= 2
        )

    wait_until(resent, 60, "the webhook to get the notification and two re-sends")
    [request] = queue.requests()
    [alert] = request.trigger["alerts"]
    assert (alert["alertname"], alert["model_version"], alert["feature"]) == (
        "CascadeFeatureDrift",
        "3",
        "age",
    )
    seen = retrain_decisions(gateway_url)
    assert seen["enqueued"] - before["enqueued"] == 1
    assert seen["not_retrain"] == before["not_retrain"]

    # the low-sample version never even became pending
    assert not [a for a in prometheus.alerts() if a["labels"].get("model_version") == "4"]
    assert prometheus.query("model_version_feature:cascade_drift_psi:max_sampled") != []
    assert not prometheus.query(
        'model_version_feature:cascade_drift_psi:max_sampled{model_version="4"}'
    )

    # the drift goes away: the resolved notification is acknowledged and queues nothing
    drift.set("3", "age", psi=0.01, samples=6000)
    wait_until(
        lambda: retrain_decisions(gateway_url)["resolved"] > before["resolved"],
        60,
        "the resolved notification",
    )
    assert [r.id for r in queue.requests()] == [request.id]
    assert retrain_decisions(gateway_url)["enqueued"] - before["enqueued"] == 1


def test_low_sample_drift_alone_fires_nothing(
    drift: DriftEndpoint, tmp_path: Path, prometheus_server: Callable[..., Prometheus]
) -> None:
    drift.set("4", "age", psi=0.9, samples=999)
    drift.set("4", "zip", psi=0.6, samples=10)
    prometheus = prometheus_server(
        targets={"cascade": [f"127.0.0.1:{drift.port}"]},
        rule_files=rules_for_tests(tmp_path / "rules", for_="1s"),
    )
    wait_until(prometheus.targets_up, 30, "the drift endpoint to be scraped")
    # the thresholds are evaluated and the PSI series scraped, yet nothing is kept or fires
    wait_until(lambda: prometheus.query("cascade_drift_psi"), 30, "the PSI series")
    wait_until(lambda: prometheus.query("cascade:threshold:drift_psi"), 30, "the thresholds")
    time.sleep(5)  # several evaluations with for: 1s
    assert prometheus.query("model_version_feature:cascade_drift_psi:max_sampled") == []
    assert prometheus.alerts() == []
    # enough samples, and the same Prometheus fires at once: the rules were live all along
    drift.set("4", "age", psi=0.9, samples=1000)
    fired = wait_until(
        lambda: [a for a in prometheus.alerts() if a["state"] == "firing"], 30, "the alert"
    )
    assert {a["labels"]["alertname"] for a in fired} >= {"CascadeFeatureDrift"}
