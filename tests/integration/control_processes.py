"""Control-plane commands as real processes (``python -m cli.main ...``) on a fake export
tree, for the tests that kill them or make Redis go away under them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from control.registry import RedisRegistry
from control.rollout.state import RolloutLog, RolloutRecord, make_rollout_log
from tests.unit.control.fake_exports import PASS, make_version, production_and_candidate

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "optest"


def export(root: Path, url: str | None) -> Path:
    """Version 1 production, version 2 a candidate the gate passed: in the Redis registry
    at ``url`` (namespace ``NAMESPACE``), or the file registry with ``url`` None."""
    if url is None:
        return production_and_candidate(root)
    for version in (1, 2):
        make_version(root, version)
    registry = RedisRegistry(url, NAMESPACE)
    registry.adopt(1, "first deploy")
    registry.register(2, PASS)
    registry.close()
    return root


def environment(url: str | None) -> dict[str, str]:
    """The CLI's settings: the fleet's Redis, or none (the embedded stack's files)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASCADE_REDIS__")}
    if url is not None:
        env.update(CASCADE_REDIS__URL=url, CASCADE_REDIS__NAMESPACE=NAMESPACE)
    return env


def rollout_log(root: Path, url: str | None) -> RolloutLog:
    return make_rollout_log(url, NAMESPACE, root)


def wait_until(condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll ``condition`` until it returns something true; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s: {what}")


class Command:
    """One ``cascade`` command in a child process, its output in files under ``directory``."""

    def __init__(self, directory: Path, url: str | None, *argv: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.stdout_path, self.stderr_path = directory / "stdout", directory / "stderr"
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cli.main", *argv],
                cwd=ROOT,
                env=environment(url),
                stdout=out,
                stderr=err,
            )

    def output(self) -> str:
        return self.stdout_path.read_text() + self.stderr_path.read_text()

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """kill -9: no ``finally`` runs, nothing is released."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def wait(self, timeout_s: float) -> int:
        return self.process.wait(timeout=timeout_s)

    def stop(self) -> None:
        if self.alive():
            self.process.kill()
        self.process.wait(timeout=10)


def controller(
    directory: Path, root: Path, url: str | None, *options: str, version: int = 2
) -> Command:
    """``cascade rollout VERSION``: no traffic ever comes, so it holds step 0 until its
    (default, hour-long) step deadline, looking every 0.2 s."""
    return Command(
        directory,
        url,
        "rollout",
        str(version),
        "--artifacts",
        str(root),
        "--interval-s",
        "0.2",
        *options,
    )


def wait_running(command: Command, log: RolloutLog, timeout_s: float = 60) -> RolloutRecord:
    """The rollout record once it runs and was looked at; fails at once if ``command``
    exits first (showing its output)."""

    def looked_at() -> RolloutRecord | None:
        assert command.alive(), command.output()
        record = log.load()
        running = record is not None and record.status == "running" and record.looks > 0
        return record if running else None

    record: RolloutRecord = wait_until(looked_at, timeout_s, "a running rollout")
    return record
