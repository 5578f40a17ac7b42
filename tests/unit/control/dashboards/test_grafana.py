"""The provisioned Grafana JSON is what the panel definitions generate, and stays bounded."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from control.dashboards.generate import generated
from control.dashboards.grafana import dashboard_json
from control.dashboards.panels import DASHBOARDS, all_panels

ROOT = Path(__file__).resolve().parents[4]
PROVISIONED = ROOT / "monitoring" / "grafana" / "dashboards"
# labels whose values come from fixed sets (never from a request)
BOUNDED_LABELS = {"le", "stage", "reason", "tier", "state", "model_version", "feature",
                  "outcome", "model", "version", "type", "name", "result", "breaker"}  # fmt: skip


def test_every_generated_file_is_current() -> None:
    stale = [
        str(path.relative_to(ROOT))
        for path, content in generated().items()
        if not path.exists() or path.read_text() != content
    ]
    assert not stale, f"stale: {stale}; run python -m control.dashboards.generate"


def test_the_kubernetes_rule_holds_every_rule_group() -> None:
    text = (ROOT / "k8s/monitoring/prometheus-rules.yaml").read_text()
    rules = list(yaml.safe_load_all(text))
    assert [r["kind"] for r in rules] == ["PrometheusRule", "PrometheusRule"]
    for rule, source in zip(rules, ("recording_rules.yml", "alert_rules.yml"), strict=True):
        groups = yaml.safe_load((ROOT / "monitoring/prometheus" / source).read_text())["groups"]
        assert rule["spec"]["groups"] == groups
        names = [g["name"] for g in rule["spec"]["groups"]]
        assert len(names) == len(set(names)), "group names must be unique per resource"


def test_every_panel_has_a_unique_title_queries_and_a_grid_place() -> None:
    for dashboard in DASHBOARDS:
        model = dashboard_json(dashboard)
        titles = [p["title"] for p in model["panels"]]
        assert len(titles) == len(set(titles))
        places = {(p["gridPos"]["x"], p["gridPos"]["y"]) for p in model["panels"]}
        assert len(places) == len(titles)
        for panel in model["panels"]:
            assert panel["targets"] and all(t["expr"] for t in panel["targets"])
    assert len({d.uid for d in DASHBOARDS}) == len(DASHBOARDS)


def test_panels_group_only_by_labels_with_fixed_value_sets() -> None:
    for _, panel in all_panels():
        for query in panel.queries:
            for group in re.findall(r"by \(([^)]*)\)", query.expr):
                labels = {label.strip() for label in group.split(",")}
                assert labels <= BOUNDED_LABELS, (panel.title, labels - BOUNDED_LABELS)


def test_threshold_series_are_drawn_as_red_dashed_lines() -> None:
    for dashboard in DASHBOARDS:
        for panel, model in zip(dashboard.panels, dashboard_json(dashboard)["panels"], strict=True):
            exprs = [t["expr"] for t in model["targets"]]
            assert [t.series for t in panel.thresholds] == exprs[len(panel.queries) :]
            styled = {o["matcher"]["options"] for o in model["fieldConfig"]["overrides"]}
            assert styled == {f"{t.alert} threshold" for t in panel.thresholds}


def test_every_alert_has_a_panel_that_draws_the_threshold_it_uses() -> None:
    """Alerts on Cascade's own metrics that judge a threshold series; those on a state (a
    replica not converged) have no threshold, those on exporters' metrics (Redis,
    kube-state-metrics) no panel of Cascade's dashboards."""
    rules = yaml.safe_load((ROOT / "monitoring/prometheus/alert_rules.yml").read_text())
    alerts = {
        rule["alert"]: rule["expr"] + json.dumps(rule.get("annotations", {}))
        for group in rules["groups"]
        for rule in group["rules"]
        if "alert" in rule and "cascade_" in rule["expr"]  # a metric (or rule) of Cascade's
    }
    drawn = {(t.alert, t.series) for _, panel in all_panels() for t in panel.thresholds}
    judged = {alert: text for alert, text in alerts.items() if "cascade:threshold:" in text}
    assert len(judged) >= 14, sorted(judged)  # the filter keeps the 14 that have a panel
    for alert, text in judged.items():
        series = [s for a, s in drawn if a == alert]
        assert series, f"no panel draws the threshold of {alert}"
        assert all(s in text for s in series), (alert, series)
    assert {a for a, _ in drawn} <= set(judged), "a panel names an alert that does not exist"


def test_provisioning_points_grafana_at_the_dashboards() -> None:
    provider = (ROOT / "monitoring/grafana/provisioning/dashboards/cascade.yml").read_text()
    assert "type: file" in provider and "/var/lib/grafana/dashboards/cascade" in provider
    for path in PROVISIONED.glob("*.json"):
        assert json.loads(path.read_text())["uid"] in {d.uid for d in DASHBOARDS}
