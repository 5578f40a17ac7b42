"""``cascade report``: the dashboards' panels as PNGs from a Prometheus
(``control/dashboards/report.py``)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import httpx

from cli.options import non_negative_float, positive_float
from control.dashboards.panels import DASHBOARDS
from control.dashboards.report import render_dashboard


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "report",
        help="render the dashboards' panels to PNG from a Prometheus (no Grafana needed)",
        description="Query a Prometheus with the dashboards' queries and write one PNG per "
        "dashboard, threshold lines included.",
    )
    parser.add_argument(
        "--prometheus",
        default="http://127.0.0.1:9090",
        help="Prometheus base URL (default: http://127.0.0.1:9090)",
    )
    parser.add_argument(
        "--minutes",
        type=positive_float,
        default=60.0,
        help="the window, ending now (default: 60)",
    )
    parser.add_argument(
        "--step",
        type=non_negative_float,
        default=0.0,
        help="seconds between points (default: 0: window / 240)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("artifacts/report"),
        help="where the PNGs go (default: artifacts/report)",
    )
    parser.add_argument(
        "--dashboard",
        choices=[d.uid for d in DASHBOARDS],
        action="append",
        help="only these dashboards (repeatable; default: all)",
    )


def run(args: argparse.Namespace) -> int:
    end = time.time()
    start = end - args.minutes * 60
    step = args.step or max(1.0, args.minutes * 60 / 240)
    chosen = [d for d in DASHBOARDS if not args.dashboard or d.uid in args.dashboard]
    with httpx.Client(base_url=args.prometheus, timeout=30.0) as client:
        for dashboard in chosen:
            path, empty = render_dashboard(client, dashboard, start, end, step, args.out)
            note = f" (no data: {'; '.join(empty)})" if empty else ""
            print(f"{path}{note}", flush=True)
    return 0
