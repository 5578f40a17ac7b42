"""`cascade retrain --from-queue` for real (embedded stack: file queue, file registry, a small
synthetic data set): the alert that triggered the retrain ends up in the version's manifest,
and a worker killed after taking a request leaves it to the next run, which retrains for it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.state.retrain_queue import FileRetrainQueue
from tests.integration.monitoring_servers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TRIGGER = {
    "source": "alertmanager",
    "group_key": '{}/{action="retrain"}:{alertname="CascadeFeatureDrift", model_version="3"}',
    "alerts": [{"alertname": "CascadeFeatureDrift", "model_version": "3", "feature": "age"}],
}


def _command(root: Path) -> list[str]:
    return [
        sys.executable, "-m", "cli.main", "retrain", "--from-queue",
        "--artifacts", str(root), "--dataset", "synthetic", "--users", "300", "--items", "400",
        "--interactions", "15000", "--two-tower-epochs", "2", "--bpr-epochs", "1",
        "--dlrm-epochs", "1", "--gbm-rounds", "20", "--force",
    ]  # fmt: skip


def _env(lease_s: float) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASCADE_REDIS__")}
    return {**env, "CASCADE_RETRAIN_TRIGGER__LEASE_S": str(lease_s)}


def test_a_killed_worker_leaves_its_request_to_the_next_run(tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    queue = FileRetrainQueue(root / "retrain" / "queue.json")
    offer = queue.offer("group|0", TRIGGER, 0, 3600)
    repo = Path(__file__).resolve().parents[2]

    # a worker takes the request and dies (SIGKILL) in the middle of the retrain
    log = tmp_path / "killed.log"
    with log.open("w") as out:
        worker = subprocess.Popen(
            _command(root), cwd=repo, env=_env(2.0), stdout=out, stderr=subprocess.STDOUT
        )
        try:
            wait_until(lambda: "[retrain" in log.read_text(), 120, "the retrain to begin")
        finally:
            worker.send_signal(signal.SIGKILL)
            worker.wait(30)
    [still] = queue.requests()
    assert still.id == offer.request_id  # not lost
    state = queue.path

    def lease_expired() -> bool:
        [entry] = json.loads(state.read_text())["requests"]
        return bool(entry["lease_until"] < time.time())

    wait_until(lease_expired, 10, "the dead worker's lease to expire")

    # the next run retrains for it and records why
    done = subprocess.run(
        _command(root), cwd=repo, env=_env(2.0), capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"retrain request {offer.request_id}" in done.stdout
    verdict = json.loads(done.stdout.strip().splitlines()[-1])
    manifest = json.loads(
        (root / "releases" / str(verdict["version"]) / "manifest.json").read_text()
    )
    trigger = manifest["training_data"]["trigger"]
    assert trigger == {**TRIGGER, "request_id": offer.request_id}
    assert queue.requests() == []

    # nothing left: the next run exits 0 at once
    idle = subprocess.run(
        _command(root), cwd=repo, env=_env(2.0), capture_output=True, text=True, timeout=120
    )
    assert idle.returncode == 0
    assert json.loads(idle.stdout.strip().splitlines()[-1]) == {"queued": 0, "ran": None}
