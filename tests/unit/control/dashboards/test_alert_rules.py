"""The rule files' shape (every alert labelled, annotated, its thresholds defined and tested
by promtool) and, where promtool is installed, ``promtool check rules`` / ``test rules``."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.monitoring_servers import RULE_FILES, RULES, require_binary

TESTS = sorted((RULES / "tests").glob("*.yml"))


def _rules() -> list[dict[str, Any]]:
    return [
        rule
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]


ALERTS = [rule for rule in _rules() if "alert" in rule]
RECORDED = {rule["record"] for rule in _rules() if "record" in rule}


def test_recording_rules_follow_the_naming_convention() -> None:
    assert RECORDED
    for name in RECORDED:
        assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", name), name


@pytest.mark.parametrize("alert", ALERTS, ids=[a["alert"] for a in ALERTS])
def test_every_alert_is_labelled_annotated_and_has_its_thresholds(alert: dict[str, Any]) -> None:
    assert alert["labels"]["severity"] in {"critical", "warning"}
    assert alert["labels"].get("action", "retrain") == "retrain"
    assert {"summary", "description"} <= set(alert["annotations"])
    used = set(re.findall(r"cascade:threshold:[a-z0-9_]+", alert["expr"]))
    quoted = set(re.findall(r"cascade:threshold:[a-z0-9_]+", alert["annotations"]["description"]))
    assert used <= RECORDED and quoted <= RECORDED
    assert quoted or not used, "the description quotes the threshold it compares against"
    assert "for" in alert


def test_an_alert_with_two_rules_has_one_per_severity() -> None:
    by_name: dict[str, list[dict[str, Any]]] = {}
    for alert in ALERTS:
        by_name.setdefault(alert["alert"], []).append(alert)
    assert {name for name, rules in by_name.items() if len(rules) > 1} == {
        "CascadeRedisDown",
        "CascadeRedisEvictions",
    }
    for rules in by_name.values():
        severities = [rule["labels"]["severity"] for rule in rules]
        assert len(set(severities)) == len(severities)


def test_the_retraining_alerts_are_the_drift_and_kpi_ones() -> None:
    retrain = {a["alert"] for a in ALERTS if a["labels"].get("action") == "retrain"}
    assert retrain == {
        "CascadeFeatureDrift",
        "CascadeScoreDistributionDrift",
        "CascadeDriftedFeatureShare",
        "CascadeCtrDrop",
        "CascadeHitRateDrop",
    }


def test_every_alert_has_a_promtool_test_that_fires_it_and_one_that_does_not() -> None:
    fired: set[str] = set()
    silent: set[str] = set()
    for path in TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fired if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {a["alert"] for a in ALERTS}
    assert names - fired == set(), "alerts no test fires"
    assert names - silent == set(), "alerts no test keeps silent"


def test_promtool_checks_and_tests_the_rules() -> None:
    promtool = require_binary("promtool")
    checked = subprocess.run(
        [promtool, "check", "rules", *map(str, RULE_FILES)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [promtool, "test", "rules", *map(str, TESTS)],
        capture_output=True,
        text=True,
        cwd=Path(RULES / "tests"),
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "FAILED" not in tested.stdout + tested.stderr


def test_alertmanager_routes_only_retraining_alerts_to_the_webhook() -> None:
    from tests.integration.monitoring_servers import ALERTMANAGER_CONFIG

    amtool = require_binary("amtool")
    config = f"--config.file={ALERTMANAGER_CONFIG}"
    checked = subprocess.run(
        [amtool, "check-config", str(ALERTMANAGER_CONFIG)], capture_output=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    for labels, receiver in [
        (["action=retrain", "alertname=CascadeFeatureDrift", "model_version=3"], "cascade-retrain"),
        (["alertname=CascadeErrorRatioHigh", "severity=critical"], "default"),
        (["action=page", "alertname=CascadeCtrDrop"], "default"),
        (["alertname=CascadeRedisEvictions", "severity=critical", "job=redis"], "default"),
        (["alertname=CascadeReplicaNotConverged", "instance=g1:8080"], "default"),
    ]:
        routed = subprocess.run(
            [amtool, "config", "routes", "test", config, *labels],
            capture_output=True,
            text=True,
        )
        assert routed.stdout.strip() == receiver, (labels, routed.stdout, routed.stderr)
    webhook = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())["receivers"][1]["webhook_configs"][0]
    assert webhook["url"].endswith("/v1/admin/alerts")
    assert webhook["http_config"]["authorization"]["credentials_file"]
