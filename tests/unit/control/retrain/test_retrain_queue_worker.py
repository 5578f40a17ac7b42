"""`cascade retrain --from-queue` around the job (the job itself replaced by a recorder): one
request per run, removed after a verdict, kept after an error, nothing queued = nothing run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from control.retrain.from_queue import run_from_queue
from services.state.retrain_queue import FileRetrainQueue
from services.util.local_redis import free_port


class Job:
    """Records the triggers it was run with and exits with ``code``."""

    def __init__(self, code: int) -> None:
        self.code = code
        self.triggers: list[dict[str, Any]] = []

    def __call__(self, args: argparse.Namespace, trigger: dict[str, Any]) -> int:
        self.triggers.append(trigger)
        return self.code


@pytest.fixture
def queue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FileRetrainQueue:
    monkeypatch.delenv("CASCADE_REDIS__URL", raising=False)
    return FileRetrainQueue(tmp_path / "retrain" / "queue.json")


def _args(tmp_path: Path) -> argparse.Namespace:
    return argparse.Namespace(artifacts=tmp_path, from_queue=True)


@pytest.mark.parametrize("code", [0, 1], ids=["passed", "rejected"])
def test_a_request_runs_once_and_is_removed_after_a_verdict(
    queue: FileRetrainQueue, tmp_path: Path, code: int
) -> None:
    offer = queue.offer("g|0", {"alerts": [{"alertname": "CascadeFeatureDrift"}]}, 0, 60)
    job = Job(code)
    assert run_from_queue(_args(tmp_path), job) == code
    assert job.triggers == [
        {"alerts": [{"alertname": "CascadeFeatureDrift"}], "request_id": offer.request_id}
    ]
    assert queue.requests() == []
    assert run_from_queue(_args(tmp_path), job) == 0  # nothing left: nothing runs
    assert len(job.triggers) == 1


def test_one_request_per_run_oldest_first(queue: FileRetrainQueue, tmp_path: Path) -> None:
    queue.offer("a|0", {"n": 1}, 0, 60)
    queue.offer("b|0", {"n": 2}, 0, 60)
    job = Job(0)
    run_from_queue(_args(tmp_path), job)
    assert [t["n"] for t in job.triggers] == [1]
    assert [r.trigger for r in queue.requests()] == [{"n": 2}]


def test_an_error_keeps_the_request_for_a_later_run(
    queue: FileRetrainQueue, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    queue.offer("g|0", {"n": 1}, 0, 60)
    assert run_from_queue(_args(tmp_path), Job(3)) == 3
    assert [r.trigger for r in queue.requests()] == [{"n": 1}]
    assert "stays queued" in capsys.readouterr().err


def test_nothing_queued_runs_nothing(
    queue: FileRetrainQueue, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = Job(0)
    assert run_from_queue(_args(tmp_path), job) == 0
    assert job.triggers == []
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == {
        "queued": 0,
        "ran": None,
    }


def test_an_unreachable_queue_is_exit_3_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CASCADE_REDIS__URL", f"redis://:hunter2@127.0.0.1:{free_port()}/0")
    job = Job(0)
    assert run_from_queue(_args(tmp_path), job) == 3
    err = capsys.readouterr().err
    assert "retrain queue" in err and "hunter2" not in err
    assert job.triggers == []


def test_bad_settings_are_exit_3_naming_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CASCADE_RETRAIN_TRIGGER__LEASE_S", "-1")
    assert run_from_queue(_args(tmp_path), Job(0)) == 3
    assert "lease_s" in capsys.readouterr().err
