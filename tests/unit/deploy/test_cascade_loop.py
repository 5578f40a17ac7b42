"""deploy/cascade-loop.sh, the workers' loop, run for real under /bin/sh: steps in order and
only after a success, the heartbeat, SIGTERM passed to the running step, bad arguments."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LOOP = str(ROOT / "deploy/cascade-loop.sh")


def run_loop(tmp_path: Path, *args: str, rounds: int = 1) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "CASCADE_LOOP_HEARTBEAT": str(tmp_path / "heartbeat"),
        "CASCADE_LOOP_ROUNDS": str(rounds),
    }
    return subprocess.run(
        ["sh", LOOP, *args], env=env, capture_output=True, text=True, timeout=30, check=False
    )


def test_steps_run_in_order_each_round(tmp_path: Path) -> None:
    log = tmp_path / "log"
    step = tmp_path / "step.sh"
    step.write_text(f'echo "$1" >> {log}\n')
    result = run_loop(tmp_path, "0", "0", f"sh {step} a", f"sh {step} b", rounds=2)
    assert result.returncode == 0, result.stderr
    assert log.read_text() == "a\nb\na\nb\n"
    assert (tmp_path / "heartbeat").exists()


def test_a_failed_step_stops_the_round_and_is_reported(tmp_path: Path) -> None:
    marker = tmp_path / "never"
    result = run_loop(tmp_path, "0", "0", "false", f"touch {marker}")
    assert result.returncode == 1
    assert "'false' exited 1" in result.stderr
    assert not marker.exists()


def test_sigterm_reaches_the_running_step(tmp_path: Path) -> None:
    got_term = tmp_path / "got-term"
    step = tmp_path / "step.py"
    step.write_text(
        "import pathlib, signal, sys, time\n"
        "def stop(*_):\n"
        f"    pathlib.Path({str(got_term)!r}).write_text('yes')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        f"pathlib.Path({str(tmp_path / 'started')!r}).write_text('')\n"
        "time.sleep(60)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "CASCADE_LOOP_HEARTBEAT": str(tmp_path / "heartbeat")}
    process = subprocess.Popen(["sh", LOOP, "5", "5", f"{sys.executable} {step}"], env=env)
    deadline = time.monotonic() + 20
    while not (tmp_path / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 143
    assert got_term.read_text() == "yes"


def test_bad_arguments_exit_2_with_usage(tmp_path: Path) -> None:
    for args in (["30"], ["x", "1", "true"], ["1", "2s", "true"]):
        result = run_loop(tmp_path, *args)
        assert result.returncode == 2 and "usage: cascade-loop" in result.stderr
