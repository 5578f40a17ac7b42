"""The repository's Alertmanager inhibitions on real servers: a Prometheus (the repository's
rules, every ``for:`` shortened) whose gateway and Triton targets answer nothing, alerting a
real Alertmanager with the repository's config. Every target of each job is down, so
CascadeAllTargetsDown fires per job and holds back the per-target alerts of the same job."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from services.util.local_redis import free_port
from tests.integration.monitoring_servers import (
    Alertmanager,
    Prometheus,
    alertmanager_config_for_tests,
    rules_for_tests,
    wait_until,
)

pytestmark = pytest.mark.integration


def _by_name(alertmanager: Alertmanager) -> dict[tuple[str, str], dict[str, Any]]:
    return {(a["labels"]["alertname"], a["labels"]["job"]): a for a in alertmanager.alerts()}


def test_a_whole_job_down_holds_back_its_per_target_alerts(
    tmp_path: Path,
    prometheus_server: Callable[..., Prometheus],
    alertmanager_server: Callable[..., Alertmanager],
) -> None:
    token = tmp_path / "token"
    token.write_text("unused")
    config = alertmanager_config_for_tests("http://127.0.0.1:9/unused", token)
    alertmanager = alertmanager_server(config)
    nothing = [f"127.0.0.1:{free_port()}"]  # a free port: every scrape is refused
    prometheus_server(
        targets={"cascade": nothing, "cascade-triton": nothing},
        rule_files=rules_for_tests(tmp_path / "rules", for_="1s"),
        alertmanager=alertmanager.url,
    )
    expected = {
        ("CascadeAllTargetsDown", "cascade"),
        ("CascadeAllTargetsDown", "cascade-triton"),
        ("CascadeTargetDown", "cascade"),
        ("CascadeTritonNotReady", "cascade-triton"),
    }
    alerts = wait_until(
        lambda: (found := _by_name(alertmanager)) and expected <= found.keys() and found,
        60,
        "the four alerts in Alertmanager",
    )
    states = {key: alerts[key]["status"]["state"] for key in expected}
    assert states == {
        ("CascadeAllTargetsDown", "cascade"): "active",
        ("CascadeAllTargetsDown", "cascade-triton"): "active",
        ("CascadeTargetDown", "cascade"): "suppressed",
        ("CascadeTritonNotReady", "cascade-triton"): "suppressed",
    }
    assert alerts["CascadeTargetDown", "cascade"]["status"]["inhibitedBy"] == [
        alerts["CascadeAllTargetsDown", "cascade"]["fingerprint"]
    ]
    assert alerts["CascadeTritonNotReady", "cascade-triton"]["status"]["inhibitedBy"] == [
        alerts["CascadeAllTargetsDown", "cascade-triton"]["fingerprint"]
    ]
