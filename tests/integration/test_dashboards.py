"""Every dashboard panel has data (issue 11), on the production shape
(``tests/integration/production_shape.py``): a gateway scoring on a real Triton (the ranker's
embedding rows through the hierarchical cache on a real Redis), ``cascade rollout
--metrics-port`` rolling out a second version in its own process, simulated users clicking,
and a real Prometheus with the repository's rules scraping the gateway, Triton's metrics port
and the controller.

Each panel's queries are read over the test's time range (the drift window and the rollout's
gauges come and go with the traffic); a panel with no series in any of its queries fails the
test, and so does a threshold line (``cascade:threshold:*``) with no value.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from control.dashboards.panels import all_panels
from control.simulator import Preferences, SimulationPlan, population, simulate
from pipelines.config import TrainConfig
from pipelines.data.synthetic import make_synthetic
from services.inference.triton_server import TritonUnavailable, wheel_directory
from tests.conftest import EXPORTED_SIZE, EXPORTED_TRAINING
from tests.integration.monitoring_servers import Prometheus, rules_for_tests, wait_until
from tests.integration.production_shape import Stack, export_twin, production_shape

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TRAFFIC_S = 20.0


@pytest.fixture
def stack(exported: Path, tmp_path: Path) -> Iterator[Stack]:
    try:
        wheel_directory()
    except TritonUnavailable as error:
        pytest.skip(f"Triton cannot run here: {error}")
    root = export_twin(exported, tmp_path / "artifacts", TrainConfig(**EXPORTED_TRAINING))
    try:
        shape = production_shape(
            root, tmp_path, drift={"window_s": 10, "sub_windows": 5, "export_interval_s": 0.5}
        )
        with shape as started:
            yield started
    except FileNotFoundError as error:  # no redis-server
        pytest.skip(str(error))


def test_every_panel_has_data_on_the_full_stack_during_a_rollout(
    stack: Stack, tmp_path: Path, prometheus_server: Callable[..., Prometheus]
) -> None:
    prometheus = prometheus_server(
        targets=stack.scrape_targets(),
        rule_files=rules_for_tests(tmp_path / "rules", for_="3s"),
    )
    wait_until(prometheus.targets_up, 60, "Prometheus to scrape all three targets")
    started = time.time()
    dataset = make_synthetic(*EXPORTED_SIZE, seed=0)
    plan = SimulationPlan(url=stack.url, rate=30, duration_s=TRAFFIC_S, k=10, concurrency=4)
    report = asyncio.run(simulate(plan, population(dataset, "all"), Preferences(dataset)))
    assert report.errors == 0, report.table()
    time.sleep(3.0)  # the last scrapes and rule evaluations
    output = stack.rollout_log.read_text()
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
