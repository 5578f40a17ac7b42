"""Every alert, in the rule file and in the generated PrometheusRule, links a runbook that
exists, names the alert and says what it means and what to do; the index lists them all."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[4]
RUNBOOKS = ROOT / "docs" / "runbooks"
BASE_URL = "https://github.com/cascade-recsys/cascade/blob/main/docs/runbooks/"
SECTIONS = ("## Meaning", "## Impact", "## Check", "## Act", "## Escalate")


def _alerts(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def _rule_file_alerts() -> list[dict[str, Any]]:
    path = ROOT / "monitoring" / "prometheus" / "alert_rules.yml"
    return _alerts(yaml.safe_load(path.read_text())["groups"])


def _prometheus_rule_alerts() -> list[dict[str, Any]]:
    path = ROOT / "k8s" / "monitoring" / "prometheus-rules.yaml"
    documents = yaml.safe_load_all(path.read_text())
    return [
        alert
        for document in documents
        if document["kind"] == "PrometheusRule"
        for alert in _alerts(document["spec"]["groups"])
    ]


SOURCES = {"alert_rules.yml": _rule_file_alerts(), "PrometheusRule": _prometheus_rule_alerts()}
CASES = [(source, alert) for source, alerts in SOURCES.items() for alert in alerts]


def test_both_sources_hold_the_same_alerts() -> None:
    names = {source: sorted(a["alert"] for a in alerts) for source, alerts in SOURCES.items()}
    assert len(names["alert_rules.yml"]) >= 22
    assert names["alert_rules.yml"] == names["PrometheusRule"]


@pytest.mark.parametrize(
    ("source", "alert"), CASES, ids=[f"{source}:{alert['alert']}" for source, alert in CASES]
)
def test_every_alert_links_its_runbook(source: str, alert: dict[str, Any]) -> None:
    name = alert["alert"]
    url = alert["annotations"].get("runbook_url")
    assert url == f"{BASE_URL}{name}.md", f"{source}: {name} has runbook_url {url!r}"
    page = RUNBOOKS / f"{name}.md"
    assert page.is_file(), f"{source}: {name} links {page.relative_to(ROOT)}, which is missing"
    text = page.read_text()
    assert text.splitlines()[0] == f"# {name}"
    positions = [text.find(f"\n{section}\n") for section in SECTIONS]
    assert -1 not in positions, f"{page.name} lacks one of {SECTIONS}"
    assert positions == sorted(positions), f"{page.name}: sections out of order"
    assert alert["labels"]["severity"] in text.split("\n## ")[0].lower()  # says how urgent


def test_every_runbook_belongs_to_an_alert_and_the_index_links_each() -> None:
    names = {alert["alert"] for alert in _rule_file_alerts()}
    pages = {path.stem for path in RUNBOOKS.glob("*.md")} - {"README"}
    assert pages == names, f"pages without an alert: {pages - names}"
    index = (RUNBOOKS / "README.md").read_text()
    linked = set(re.findall(r"\]\((\w+)\.md\)", index))
    assert linked == names


def test_every_relative_link_of_a_runbook_resolves() -> None:
    for page in RUNBOOKS.glob("*.md"):
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links {target}"
