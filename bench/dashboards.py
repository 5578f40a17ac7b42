"""Every dashboard on the production shape: which panels have data, rendered to PNG.

``cascade report`` draws every dashboard for a reader without Grafana.

The real parts (``tests/integration/production_shape.py``): a gateway scoring on a real
Triton (the ranker's embedding cache on a real Redis), ``cascade rollout --metrics-port``
rolling out a second version, simulated users clicking, a real Prometheus with the
repository's rules scraping the gateway, Triton's metrics port and the controller. The
integration test ``test_dashboards.py`` checks the same for 30 s; this runs longer and keeps
the pictures. Prints one line per panel (series found), then one JSON object.

    python bench/dashboards.py [--duration 360] [--rate 30] [--out bench/results/dashboards-report]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from control.dashboards.panels import all_panels
from control.dashboards.report import query_range
from control.simulator import Preferences, SimulationPlan, population, simulate
from pipelines.config import TrainConfig
from pipelines.data.synthetic import make_synthetic
from pipelines.pipeline import run_pipeline
from tests.integration.monitoring_servers import start_prometheus, wait_until
from tests.integration.production_shape import export_twin, production_shape

SIZE = (1000, 1000, 50_000)  # synthetic users, items, interactions
TRAIN = TrainConfig(two_tower_epochs=3, bpr_epochs=1, dlrm_epochs=2, gbm_rounds=50)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=360.0,
        help="seconds of traffic (the panels' 5m rates fill)",
    )
    parser.add_argument("--rate", type=float, default=30.0, help="simulated requests/s")
    parser.add_argument(
        "--out", type=Path, default=Path("bench/results/dashboards-report"), help="PNGs go here"
    )
    args = parser.parse_args()
    if args.duration <= 0 or args.rate <= 0:
        parser.error("--duration and --rate must be > 0")

    directory = Path(tempfile.mkdtemp(prefix="cascade-bench-dashboards-"))
    try:
        log(f"training and exporting version 1 on synthetic data {SIZE}, then its twin 2")
        run_pipeline(
            directory / "v1" / "work",
            directory / "v1",
            TRAIN,
            dataset="synthetic",
            synthetic_size=SIZE,
            log=lambda _: None,
        )
        root = export_twin(directory / "v1", directory / "artifacts", TRAIN)
        log("starting Redis, Triton, the gateway and `cascade rollout 2`")
        with production_shape(
            root, directory, drift={"window_s": 60, "sub_windows": 6, "export_interval_s": 5.0}
        ) as stack:
            prometheus = start_prometheus(
                directory / "prometheus", stack.scrape_targets(), interval="5s"
            )
            try:
                wait_until(prometheus.targets_up, 60, "Prometheus to scrape all three targets")
                started = time.time()
                log(f"traffic: {args.rate:g} requests/s for {args.duration:g} s")
                dataset = make_synthetic(*SIZE, seed=0)
                plan = SimulationPlan(
                    url=stack.url, rate=args.rate, duration_s=args.duration, k=10, seed=3
                )
                traffic = asyncio.run(
                    simulate(plan, population(dataset, "all"), Preferences(dataset), log)
                )
                print(traffic.table(), flush=True)
                time.sleep(12)  # the last scrapes and rule evaluations
                ended = time.time()
                found = {}
                with httpx.Client(base_url=prometheus.url, timeout=30) as client:
                    for dashboard, panel in all_panels():
                        series = sum(
                            len(query_range(client, query.expr, started, ended, 5.0))
                            for query in panel.queries
                        )
                        found[f"{dashboard.uid}: {panel.title}"] = series
                        print(f"{series:>4} series  {dashboard.uid}: {panel.title}", flush=True)
                minutes = (ended - started) / 60 + 0.5
                rendered = subprocess.run(
                    [sys.executable, "-m", "cli.main", "report", "--prometheus",
                     prometheus.url, "--minutes", f"{minutes:.1f}", "--out", str(args.out)],
                    capture_output=True, text=True, check=False,
                )  # fmt: skip
                log(f"cascade report: {rendered.stdout.strip() or rendered.stderr.strip()}")
            finally:
                prometheus.stop()
            rollout_output = stack.rollout_log.read_text().strip().splitlines()
        empty = sorted(name for name, series in found.items() if series == 0)
        result = {
            "panels": len(found),
            "panels_with_data": len(found) - len(empty),
            "share_with_data": round((len(found) - len(empty)) / len(found), 3),
            "empty": empty,
            "traffic": traffic.as_dict(),
            # the controller's verdict line when the rollout ended, else its last look
            "rollout": next(
                (line for line in reversed(rollout_output) if " vs production " in line),
                next((line for line in reversed(rollout_output) if "look " in line), None),
            ),
            "pngs": sorted(str(p) for p in args.out.glob("*.png")),
        }
        print(json.dumps(result))
        return 0 if not empty and rendered.returncode == 0 else 1
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
