"""The README's walkthrough ("The continuous-training loop, in one walkthrough"), shortened:
the same commands and flags in a folder of its own, on the embedded stack, with tiny epochs,
seconds of simulated traffic and second-long rollout looks. It checks the outcomes the
README prints: version 2 a candidate (the small-holdout gate passes), the sabotaged version
3 rejected as worse, `cascade versions`, and a rollout that plans and reaches a decision.

Train, serve and simulate run once for the module; each test checks one step's outcome.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.main import main
from services.util.local_redis import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
GATE = REPO / "control" / "validation" / "gate-small-holdout.yaml"
# The README's models with the fewest epochs that still train them (the gate's verdict on
# an equal candidate is what matters here, not the models' quality)
TINY = [
    "--two-tower-epochs", "2", "--bpr-epochs", "1", "--dlrm-epochs", "1", "--gbm-rounds", "20",
]  # fmt: skip


def _cascade(*args: str) -> tuple[int, str]:
    """One command in process (saves the interpreter's start and torch's import)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(args))
    return code, out.getvalue()


def _process(*args: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cli.main", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _stop(process: subprocess.Popen) -> str:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=60)
    return out


def _wait_ready(url: str, serve: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if serve.poll() is not None:
            pytest.fail(f"cascade serve exited with {serve.returncode}:\n{_stop(serve)}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"{url}/health/ready", timeout=2) as answer,
        ):
            if answer.status == 200:
                return
        time.sleep(0.5)
    pytest.fail(f"cascade serve not ready after {timeout_s} s:\n{_stop(serve)}")


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The walkthrough's steps up to the rollout, as the README runs them."""
    mp = pytest.MonkeyPatch()
    for name in [k for k in os.environ if k.startswith("CASCADE_")]:
        mp.delenv(name)  # the embedded stack, whatever the caller's environment says
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASCADE_")}
    loop = tmp_path_factory.mktemp("walkthrough") / "loop"
    steps: dict = {"loop": loop, "env": env}
    code, _ = _cascade(
        "train", "--base-fraction", "0.8", "--workdir", str(loop / "work"), "--output", str(loop),
        *TINY,
    )  # fmt: skip
    assert code == 0
    port = free_port()
    url = steps["url"] = f"http://127.0.0.1:{port}"
    serve = _process("serve", "--artifacts", str(loop), "--port", str(port), env=env)
    try:
        _wait_ready(url, serve)
        key = str(loop / "feedback.key")
        code, out = _cascade(
            "simulate", "--url", url, "--feedback-key-file", key, "--rate", "30",
            "--duration", "8",
        )  # fmt: skip
        assert code == 0, out
        steps["simulated"] = json.loads(out.strip().splitlines()[-1])
        retrain = ("retrain", "--artifacts", str(loop), "--gate-config", str(GATE), *TINY)
        steps["good"] = _cascade(*retrain)
        steps["bad"] = _cascade(*retrain, "--sabotage", "shuffled-embeddings")
        steps["versions"] = _cascade("versions", "--artifacts", str(loop))
        yield steps
    finally:
        _stop(serve)
        mp.undo()


def _verdict(loop: Path, version: int) -> dict:
    return json.loads((loop / "releases" / str(version) / "validation.json").read_text())


def _summary(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_the_simulated_users_click(walkthrough: dict) -> None:
    simulated = walkthrough["simulated"]
    assert set(simulated["versions"]) == {"1"}, simulated  # version 1 answered
    assert simulated["versions"]["1"]["clicks"] > 0, simulated


def test_version_2_passes_the_small_holdout_gate(walkthrough: dict) -> None:
    code, out = walkthrough["good"]
    summary = _summary(out)
    assert (code, summary["version"], summary["verdict"]) == (0, 2, "pass"), out
    verdict = _verdict(walkthrough["loop"], 2)
    assert verdict["production"] == 1
    judged = {c["name"]: c for c in verdict["checks"] if c["kind"] == "non_inferiority"}
    assert set(judged) == {
        f"non_inferiority.{m}" for m in ("recall@10", "ndcg@10", "auc", "logloss")
    }
    assert all(c["outcome"] == "non_inferior" for c in judged.values()), judged
    assert "registered version 2 as candidate" in out


def test_the_sabotaged_version_3_is_rejected_as_worse(walkthrough: dict) -> None:
    code, out = walkthrough["bad"]
    summary = _summary(out)
    assert (code, summary["version"], summary["verdict"]) == (1, 3, "fail"), out
    verdict = _verdict(walkthrough["loop"], 3)
    assert "non_inferiority.recall@10" in verdict["worse"], verdict["failed_checks"]
    assert "registered version 3 as rejected" in out


def test_versions_lists_what_the_readme_says(walkthrough: dict) -> None:
    code, out = walkthrough["versions"]
    assert code == 0
    states = dict(re.findall(r"^(\d+)\s+(\w+(?: \(adopted\))?)", out, re.MULTILINE))
    assert states == {"1": "production (adopted)", "2": "candidate", "3": "rejected"}, out


def test_the_rollout_plans_and_reaches_a_decision(walkthrough: dict) -> None:
    loop, env = str(walkthrough["loop"]), walkthrough["env"]
    traffic = _process(
        "simulate", "--url", walkthrough["url"], "--feedback-key-file",
        str(walkthrough["loop"] / "feedback.key"), "--rate", "40", "--duration", "60", env=env,
    )  # fmt: skip
    try:
        time.sleep(3)  # the canary's traffic has started
        code, plan = _cascade("rollout", "candidate", "--artifacts", loop, "--plan")
        assert code in (0, 1), plan  # 1: a step cannot decide within the deadline
        assert re.search(r"^plan: --steps auto: ", plan, re.MULTILINE), plan
        code, out = _cascade(
            "rollout", "candidate", "--artifacts", loop, "--interval-s", "1", "--min-step-s",
            "2", "--min-impressions", "200", "--step-deadline-s", "8",
        )  # fmt: skip
        assert "rollout " in out and "version 2 against production 1" in out, out
    finally:
        _stop(traffic)
    status = re.search(r"version 2 vs production 1: (promoted|rolled back)(?: \((\w+)\))?", out)
    assert status is not None, out
    assert code == (0 if status[1] == "promoted" else 1), out
    assert status[2] != "no_traffic", out  # traffic flowed the whole time
    code, shown = _cascade("rollout", "status", "--artifacts", loop)
    assert code == 0
    assert "last look" in shown and status[0] in shown, shown
