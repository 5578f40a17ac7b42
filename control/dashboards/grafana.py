"""Grafana dashboard JSON from the panel definitions (``python -m control.dashboards.generate``
rewrites the provisioned files; a test checks they match)."""

from __future__ import annotations

import json
from typing import Any

from control.dashboards.panels import Dashboard, Panel

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
WIDTH, HEIGHT, COLUMNS = 12, 8, 2  # Grafana's grid is 24 wide
GRAFANA_UNITS = {"ratio": "none"}  # threshold units that are not Grafana unit ids


def _threshold_override(panel: Panel, name: str) -> dict[str, Any]:
    """Threshold series: red dashed lines (on a right axis when in another unit)."""
    properties: list[dict[str, Any]] = [
        {"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}},
        {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
    ]
    if panel.threshold_unit is not None:
        properties += [
            {"id": "custom.axisPlacement", "value": "right"},
            {"id": "unit", "value": GRAFANA_UNITS.get(panel.threshold_unit, panel.threshold_unit)},
        ]
    return {"matcher": {"id": "byName", "options": name}, "properties": properties}


def _panel(panel: Panel, index: int) -> dict[str, Any]:
    queries = [*panel.queries, *(t.query for t in panel.thresholds)]
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {
            "x": (index % COLUMNS) * WIDTH,
            "y": (index // COLUMNS) * HEIGHT,
            "w": WIDTH,
            "h": HEIGHT,
        },
        "targets": [
            {"refId": chr(ord("A") + i), "expr": q.expr, "legendFormat": q.legend or "__auto"}
            for i, q in enumerate(queries)
        ],
        "fieldConfig": {
            "defaults": {"unit": panel.unit, "custom": {"lineWidth": 1}},
            "overrides": [_threshold_override(panel, t.query.legend) for t in panel.thresholds],
        },
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
    }


def dashboard_json(dashboard: Dashboard) -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (schema 39; datasource chosen by a variable)."""
    annotations = [
        {
            "name": "Grafana annotations",
            "builtIn": 1,
            "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True,
            "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)",
            "type": "dashboard",
        }
    ]
    annotations += [
        {
            "name": query.legend,
            "datasource": DATASOURCE,
            "enable": True,
            "iconColor": "orange",
            "expr": query.expr,
            "step": "30s",
            "titleFormat": query.legend,
        }
        for query in dashboard.annotations
    ]
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": ["cascade"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "timezone": "utc",
        "annotations": {"list": annotations},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                }
            ]
        },
        "panels": [_panel(panel, i) for i, panel in enumerate(dashboard.panels)],
    }


def render(dashboard: Dashboard) -> str:
    return json.dumps(dashboard_json(dashboard), indent=2, sort_keys=True) + "\n"


def file_name(dashboard: Dashboard) -> str:
    return f"{dashboard.uid}.json"
