"""The dashboards' panels rendered to PNG from a Prometheus, for a user
without Grafana (same queries, same threshold lines). One PNG per dashboard."""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from control.dashboards.panels import Dashboard, Panel, Query
from core.errors import CascadeError
from core.files import writable_dir

UNIT_SCALE = {"percentunit": (100.0, "%"), "s": (1000.0, "ms"), "reqps": (1.0, "req/s")}


class PrometheusUnavailable(CascadeError):
    """Prometheus did not answer, or refused a query."""


@dataclass(frozen=True)
class Series:
    label: str
    times: list[float]
    values: list[float]


def query_range(
    client: httpx.Client, expr: str, start: float, end: float, step: float
) -> list[dict[str, Any]]:
    """Prometheus' ``/api/v1/query_range`` result (a list of series)."""
    try:
        response = client.get(
            "/api/v1/query_range", params={"query": expr, "start": start, "end": end, "step": step}
        )
    except httpx.HTTPError as error:
        raise PrometheusUnavailable(
            f"Prometheus at {client.base_url} did not answer: {error}"
        ) from error
    body = (
        response.json()
        if response.headers.get("content-type", "").startswith("application/json")
        else {}
    )
    if response.status_code != 200 or body.get("status") != "success":
        raise PrometheusUnavailable(
            f"Prometheus refused {expr!r}: {body.get('error', response.text[:200])}"
        )
    return list(body["data"]["result"])


def _legend(template: str, labels: dict[str, str]) -> str:
    """Grafana's ``{{label}}`` legend filled in; a series without those labels (the ``or
    vector(0)`` of a panel with nothing to count) is called "none"."""
    text = template or ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "value"
    for key, value in labels.items():
        text = text.replace("{{" + key + "}}", value)
    text = re.sub(r"\{\{[^}]*\}\}", "", text).strip()
    return text or "none"


def query_series(
    client: httpx.Client, query: Query, start: float, end: float, step: float
) -> list[Series]:
    """The series one query returns over the window (NaN and Inf points dropped)."""
    out = []
    for result in query_range(client, query.expr, start, end, step):
        points = [(float(t), float(v)) for t, v in result["values"]]
        points = [(t, v) for t, v in points if math.isfinite(v)]
        if points:
            times, values = zip(*points, strict=True)
            out.append(Series(_legend(query.legend, result["metric"]), list(times), list(values)))
    return out


def panel_series(
    client: httpx.Client, panel: Panel, start: float, end: float, step: float
) -> list[Series]:
    """Every series of every query of the panel."""
    return [s for q in panel.queries for s in query_series(client, q, start, end, step)]


def _draw_thresholds(
    client: httpx.Client, ax: Any, panel: Panel, window: tuple[float, float, float], scale: float
) -> None:
    """Each threshold series as a red dashed line, labelled with its alert (on a second axis
    when the thresholds are in another unit than the panel)."""
    if not panel.thresholds:
        return
    start, end, step = window
    target = ax
    if panel.threshold_unit is not None:
        target = ax.twinx()
        target.set_ylabel(f"threshold ({panel.threshold_unit})", fontsize=8, color="red")
        target.tick_params(labelsize=7, colors="red")
        scale = 1.0
    for index, threshold in enumerate(panel.thresholds):
        for series in query_series(client, threshold.query, start, end, step):
            times, values = series.times, series.values
            target.plot([t - end for t in times], [v * scale for v in values], "r--", lw=1)
            at = len(times) - 1 - index * len(times) // 3  # labels of equal lines side by side
            target.annotate(
                f"{threshold.alert} {values[at] * scale:g}",
                (times[at] - end, values[at] * scale),
                color="red",
                fontsize=7,
                ha="right",
                va="bottom",
            )


def render_dashboard(
    client: httpx.Client, dashboard: Dashboard, start: float, end: float, step: float, out: Path
) -> tuple[Path, list[str]]:
    """One PNG of the dashboard's panels (a grid, two per row); returns it and the titles of
    panels that had no data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = dashboard.panels
    rows = math.ceil(len(panels) / 2)
    figure, axes = plt.subplots(rows, 2, figsize=(14, 3.6 * rows), squeeze=False)
    empty = []
    for ax, panel in zip(axes.flat, panels, strict=False):
        scale, unit = UNIT_SCALE.get(panel.unit, (1.0, ""))
        series = panel_series(client, panel, start, end, step)
        for s in series[:12]:  # a legend of more lines is unreadable; the rest are left out
            ax.plot(
                [t - end for t in s.times], [v * scale for v in s.values], label=s.label, lw=1.2
            )
        _draw_thresholds(client, ax, panel, (start, end, step), scale)
        if not series:
            empty.append(panel.title)
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("seconds before the end of the window", fontsize=8)
        ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if series:
            ax.legend(fontsize=7, loc="upper left")
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    figure.suptitle(
        f"{dashboard.title} (until {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(end))})"
    )
    figure.tight_layout()
    writable_dir(out)
    path = out / f"{dashboard.uid}.png"
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path, empty
