"""A rank that dies (SIGKILL) or stops answering (SIGSTOP) in the middle of a data-parallel
epoch of `cascade train` under torchrun: the job fails with a message saying so, the
surviving rank does not wait forever, and no release is written."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
TRAIN = [
    "train",
    *("--dataset", "synthetic", "--users", "300", "--items", "400", "--interactions", "15000"),
    # many short steps, and no early stop: the second epoch is under way when the first ends
    *("--two-tower-epochs", "50", "--two-tower-batch", "32", "--patience", "50"),
]


@contextmanager
def launched(root: Path, timeout_s: str) -> Iterator[subprocess.Popen[str]]:
    command = [
        str(BIN / "torchrun"),
        "--standalone",
        "--nproc_per_node",
        "2",
        # the agent looks at its workers every 5 s: rank 0 sees the lost peer first (at its
        # next collective), so its own message is in the output before the agent stops it
        "--monitor-interval",
        "5",
        "--no-python",
        str(BIN / "cascade"),
        *TRAIN,
        *("--workdir", str(root / "work"), "--output", str(root)),
    ]
    env = {**os.environ, "CASCADE_DIST_TIMEOUT_S": timeout_s}
    job = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        yield job
    finally:
        left = psutil.Process(job.pid).children(recursive=True) if job.poll() is None else []
        for process in left:
            process.send_signal(signal.SIGCONT)
            process.kill()
        job.kill()
        job.wait()


def _read_until(job: subprocess.Popen[str], marker: str, limit_s: float = 240) -> str:
    """What the job printed up to the line containing ``marker``."""
    assert job.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([job.stdout], [], [], 1.0)
        if ready:
            line = job.stdout.readline()
            if not line:
                break
            seen.append(line)
            if marker in line:
                return "".join(seen)
    pytest.fail(f"{marker!r} never came; the job printed:\n{''.join(seen)[-3000:]}")


def _rank(job: subprocess.Popen[str], rank: int) -> psutil.Process:
    for process in psutil.Process(job.pid).children(recursive=True):
        if process.environ().get("RANK") == str(rank):
            return process
    raise AssertionError(f"no process of rank {rank} under torchrun")


def _rest(job: subprocess.Popen[str]) -> str:
    assert job.stdout is not None
    rest = job.stdout.read()
    job.wait(timeout=120)
    return rest


def _nothing_exported(root: Path) -> bool:
    releases = root / "releases"
    return not releases.exists() or not any(releases.iterdir())


def test_a_killed_rank_fails_the_job_with_nothing_exported(tmp_path: Path) -> None:
    with launched(tmp_path, "300") as job:
        printed = _read_until(job, "two-tower epoch 1/50")
        _rank(job, 1).kill()  # mid-way through epoch 2
        printed += _rest(job)
    assert job.returncode != 0
    assert "distributed training failed on rank 0 of 2" in printed, printed[-3000:]
    assert "another rank probably died" in printed
    assert "Signal 9 (SIGKILL) received" in printed  # torchrun names the rank that died
    assert _nothing_exported(tmp_path)


def test_a_rank_that_stops_answering_times_out_the_others(tmp_path: Path) -> None:
    """SIGSTOP keeps its connections open: only the process group's timeout ends the wait."""
    with launched(tmp_path, "8") as job:
        printed = _read_until(job, "two-tower epoch 1/50")
        stopped = _rank(job, 1)
        stopped.suspend()
        printed += _read_until(job, "distributed training failed on rank 0 of 2")
        stopped.resume()  # torchrun's SIGTERM reaches it now
        printed += _rest(job)
    assert job.returncode != 0
    assert "timed out" in printed.lower(), printed[-3000:]
    assert _nothing_exported(tmp_path)
