"""``cascade serve --workers 2``: every scrape of ``/metrics``, whichever worker answers it,
shows the counts of both workers (prometheus_client's multiprocess mode). Without it each
scrape showed one worker's counters, and Prometheus read the alternation as resets."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
from prometheus_client import multiprocess

from services.util.local_redis import free_port
from tests.integration.monitoring_servers import wait_until
from tests.integration.served_app import wait_until_ready

REQUESTS = 60


def _total(text: str, name: str) -> float:
    """The sum of a metric's samples in a text exposition."""
    pattern = re.compile(rf"^{name}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
    return sum(float(value) for value in pattern.findall(text))


def _answered_per_worker(metrics_dir: Path) -> dict[int, float]:
    """Requests each worker process recorded, read from its own histogram file."""
    found = {}
    for path in metrics_dir.glob("histogram_*.db"):
        pid = int(path.stem.rsplit("_", 1)[1])
        for metric in multiprocess.MultiProcessCollector.merge([str(path)], accumulate=False):
            for sample in metric.samples:
                # a worker's file holds each bucket's own count (not cumulative, no _count)
                if sample.name == "cascade_request_latency_seconds_bucket":
                    found[pid] = found.get(pid, 0.0) + sample.value
    return found


def test_two_workers_export_the_counts_of_both_on_every_scrape(
    exported: Path, tmp_path: Path
) -> None:
    artifacts = tmp_path / "artifacts"
    shutil.copytree(exported, artifacts, ignore=shutil.ignore_patterns("work", "retrain"))
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    (metrics_dir / "counter_1.db").write_bytes(b"left by an earlier run")  # removed at start
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASCADE_")}
    env |= {
        "CASCADE_FEEDBACK__REQUIRE_DURABLE": "false",
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
    }
    serve = subprocess.Popen(
        [
            *(sys.executable, "-m", "cli.main", "serve", "--workers", "2"),
            *("--artifacts", str(artifacts), "--port", str(port)),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "serve.err").open("wb"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(serve, url)
        assert not (metrics_dir / "counter_1.db").exists()
        errors = tmp_path / "serve.err"

        def both_ready() -> bool:  # the second worker finishes loading too: each logs it
            return errors.read_text().count("gateway ready") >= 2

        wait_until(both_ready, 60, "both workers to log their ready line")
        assert errors.read_text().count("gateway ready") == 2, errors.read_text()[-3000:]
        for number in range(REQUESTS):  # a new connection each: the workers share them out
            answer = httpx.post(f"{url}/v1/recommend", json={"user_id": number % 50, "k": 5})
            assert answer.status_code == 200, answer.text
        per_worker = _answered_per_worker(metrics_dir)
        assert sum(per_worker.values()) == REQUESTS
        assert len([n for n in per_worker.values() if n > 0]) == 2, per_worker
        for _ in range(6):  # each scrape is a new connection too: both workers answer some
            text = httpx.get(f"{url}/metrics", timeout=10).text
            assert _total(text, "cascade_request_latency_seconds_count") == REQUESTS
            assert _total(text, "cascade_recommendations_total") == REQUESTS
            assert 'cascade_online_store_state{state="ok"} 1.0' in text
        # the embedded store is per worker: the command says so
        assert "--workers 2 without CASCADE_REDIS__URL" in (tmp_path / "serve.err").read_text()
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
