"""Drift -> alert -> retrain, timed: how long after a population shift does the retraining
alert fire, the webhook queue a retrain, and a worker start it; and how many retrains does
stationary traffic start in the same time (target: 0).

The real parts: a gateway (embedded stack) on a synthetic release, simulated users, a real
Prometheus (the repository's rules) and Alertmanager (the repository's routing) calling the
gateway's webhook; the benchmark polls the retrain queue as a worker would.

Two phases of equal length on the same stack: stationary traffic (everyone), then the
population shifts (``--shift-to``, default users aged 50+). Defaults are the production
settings (15-minute drift window, ``for: 10m``, 1,000 samples): about 45 minutes.
``--quick`` shortens the window, the ``for:`` durations and the minimum sample (about 6 min).

    python bench/drift.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from control.simulator import Preferences, SimulationPlan, population, simulate
from pipelines.config import TrainConfig
from pipelines.data.synthetic import make_synthetic
from pipelines.pipeline import run_pipeline
from services.settings import Settings
from services.state.retrain_queue import FileRetrainQueue
from tests.integration.monitoring_servers import (
    alertmanager_config_for_tests,
    rules_for_tests,
    start_alertmanager,
    start_prometheus,
)
from tests.integration.served_app import export_copy_with_admin_token, served_app

SIZE = (1000, 1000, 50_000)  # synthetic users, items, interactions
TRAIN = TrainConfig(two_tower_epochs=3, bpr_epochs=1, dlrm_epochs=2, gbm_rounds=50)
TOKEN = "bench-drift-token"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def build(root: Path) -> None:
    log(f"training and exporting a release on synthetic data {SIZE}")
    run_pipeline(root / "work", root, TRAIN, dataset="synthetic", synthetic_size=SIZE, log=log)


class Watch:
    """Polls Prometheus, the queue (claiming as a worker would) in a thread; records the
    first time each event happens after ``since``."""

    def __init__(self, prometheus: Any, queue: FileRetrainQueue, poll_s: float) -> None:
        self.prometheus, self.queue, self.poll_s = prometheus, queue, poll_s
        self.events: dict[str, float] = {}
        self.claimed: list[Any] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _first(self, name: str) -> None:
        self.events.setdefault(name, time.time())

    def _run(self) -> None:
        while not self.stop.wait(self.poll_s):
            alerts = [a for a in self.prometheus.alerts() if a["labels"].get("action") == "retrain"]
            if any(a["state"] == "pending" for a in alerts):
                self._first("alert_pending")
            if any(a["state"] == "firing" for a in alerts):
                self._first("alert_firing")
            if self.queue.requests():
                self._first("retrain_enqueued")
            request = self.queue.claim("bench-worker", lease_s=3600)
            if request is not None:
                self.claimed.append(request)
                self._first("retrain_started")

    def psi(self, feature: str) -> float | None:
        rows = self.prometheus.query(f'max(cascade_drift_psi{{feature="{feature}"}})')
        return float(rows[0]["value"][1]) if rows else None


def traffic(url: str, to: str, seconds: float, rate: float, seed: int) -> dict[str, Any]:
    dataset = make_synthetic(*SIZE, seed=0)
    plan = SimulationPlan(url=url, rate=rate, duration_s=seconds, k=10, concurrency=8, seed=seed)
    report = asyncio.run(
        simulate(plan, population(dataset, to), Preferences(dataset), lambda line: log(line))
    )
    requests = sum(tally.requests for tally in report.per_version.values())
    return {"requests": requests, "errors": report.errors, "degraded": report.degraded}


def _seconds(duration: str) -> float:
    """Prometheus duration ('30s', '10m') in seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    return float(duration[:-1]) * units[duration[-1]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short window, for: and sample")
    parser.add_argument("--phase-s", type=float, default=None, help="seconds per phase")
    parser.add_argument("--rate", type=float, default=30.0, help="simulated requests/s (30)")
    parser.add_argument("--shift-to", default="old", help="shifted population (default: old)")
    parser.add_argument("--artifacts", type=Path, help="reuse this export root (default: build)")
    parser.add_argument(
        "--report",
        type=Path,
        default=Path("bench/results/drift-report"),
        help="where `cascade report` PNGs of both phases go (default: bench/results/drift-report)",
    )
    args = parser.parse_args()
    window_s, for_, min_samples = (60.0, "30s", 300) if args.quick else (900.0, "10m", 1000)
    phase_s = args.phase_s or (180.0 if args.quick else 1500.0)

    directory = Path(tempfile.mkdtemp(prefix="cascade-bench-drift-"))
    servers = contextlib.ExitStack()  # stops what was started, in reverse, whatever happens
    try:
        if args.artifacts is None:
            build(directory / "export")
            source = directory / "export"
        else:
            source = args.artifacts
        artifacts, token_file = export_copy_with_admin_token(source, directory, TOKEN)
        settings = Settings(
            artifacts=artifacts,
            admin={"token_file": token_file},
            drift={"window_s": window_s, "sub_windows": 15, "export_interval_s": 5.0},
        )
        url = servers.enter_context(served_app(settings))
        alertmanager = start_alertmanager(
            directory / "alertmanager",
            alertmanager_config_for_tests(
                f"{url}/v1/admin/alerts",
                token_file,
                {"group_wait": "30s", "group_interval": "5m", "repeat_interval": "4h"},
            ),
        )
        servers.callback(alertmanager.stop)
        rules = rules_for_tests(
            directory / "rules", for_=for_, thresholds={"drift_min_samples": min_samples}
        )
        prometheus = start_prometheus(
            directory / "prometheus",
            {"cascade": [url.removeprefix("http://")]},
            rules,
            alertmanager=alertmanager.url,
            interval="5s",
        )
        servers.callback(prometheus.stop)
        queue = FileRetrainQueue(artifacts / "retrain" / "queue.json")
        watch = Watch(prometheus, queue, poll_s=2.0)
        watch.thread.start()
        started = time.time()
        try:
            log(f"phase 1: stationary traffic for {phase_s:g} s")
            stationary = traffic(url, "all", phase_s, args.rate, seed=1)
            stationary_retrains = len(watch.claimed) + len(queue.requests())
            stationary_psi = watch.psi("user_age")
            watch.events.clear()
            log(f"phase 2: the population shifts to {args.shift_to!r} for {phase_s:g} s")
            onset = time.time()
            shifted = traffic(url, args.shift_to, phase_s, args.rate, seed=2)
            time.sleep(10)  # the last scrape, evaluation and notification
            shifted_psi = watch.psi("user_age")
            report = subprocess.run(
                [sys.executable, "-m", "cli.main", "report", "--prometheus", prometheus.url,
                 "--minutes", f"{(time.time() - started) / 60 + 1:.1f}", "--out", str(args.report)],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            log(f"cascade report: {report.stdout.strip() or report.stderr.strip()}")
        finally:
            watch.stop.set()
            watch.thread.join(10)
            servers.close()

        def after(name: str) -> float | None:
            at = watch.events.get(name)
            return None if at is None else round(at - onset, 1)

        result = {
            "settings": {"window_s": window_s, "for": for_, "min_samples": min_samples,
                         "phase_s": phase_s, "rate": args.rate, "shift_to": args.shift_to},
            "stationary": {**stationary, "retrains_started": stationary_retrains,
                           "user_age_psi": stationary_psi},
            "shifted": {**shifted, "user_age_psi": shifted_psi,
                        "retrains_started": len(watch.claimed)},
            "seconds_to_alert_pending": after("alert_pending"),
            "seconds_to_alert_firing": after("alert_firing"),
            "seconds_to_retrain_enqueued": after("retrain_enqueued"),
            "seconds_to_retrain_started": after("retrain_started"),
            "retrains_started_stationary": stationary_retrains,
        }  # fmt: skip
        firing = result["seconds_to_alert_firing"]
        # the limit measured against: the rule's own wait (for:) plus the window's fill time
        limit = _seconds(for_) + window_s
        result["alert_delay_over_for_plus_window"] = (
            None if firing is None else round(firing / limit, 2)
        )
        log(
            f"stationary: {stationary_retrains} retrains started (target 0), user_age PSI "
            f"{stationary_psi}; after the shift: alert pending {result['seconds_to_alert_pending']}"
            f" s, firing {firing} s ({result['alert_delay_over_for_plus_window']} x (for: {for_}"
            f" + window {window_s:g} s)), retrain queued {result['seconds_to_retrain_enqueued']}"
            f" s, started {result['seconds_to_retrain_started']} s"
        )
        print(json.dumps(result))
        return 0 if stationary_retrains == 0 and watch.claimed else 1
    finally:
        servers.close()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
