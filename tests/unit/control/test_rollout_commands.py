"""`cascade rollout` / `rollback` / `promote` on a fake export tree (embedded stack: file
registry, desired state and audit trail)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import main
from control.registry import FileRegistry, VersionState
from services.state.desired_state import FileDesiredState
from tests.unit.control.fake_exports import production_and_candidate


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    return production_and_candidate(tmp_path / "artifacts")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_rollout_lifecycle_from_the_command_line(
    artifacts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(artifacts)
    code, out, _ = _run(capsys, "rollout", "status", "--artifacts", root)
    assert code == 0 and "no rollout has run" in out
    code, out, _ = _run(
        capsys, "rollout", "candidate", "--artifacts", root, "--once", "--interval-s", "0.01"
    )
    assert code == 0 and "version 2 against production 1, step 0 at 5%" in out
    assert "look 1: step 0 (5%) hold (insufficient_data)" in out
    code, out, _ = _run(capsys, "rollout", "status", "--artifacts", root, "--json")
    status = json.loads(out)
    assert status["rollout"]["version"] == 2 and status["rollout"]["status"] == "running"
    assert status["desired"]["canary"] == 2 and status["desired"]["canary_weight"] == 0.05
    assert [entry["event"] for entry in status["audit"]] == ["started", "look"]
    code, out, _ = _run(capsys, "rollback", "--artifacts", root, "--reason", "test")
    assert code == 0 and "serving production 1" in out
    desired = FileDesiredState(artifacts / "rollout" / "desired.json").read()
    assert desired is not None and desired.canary is None
    registry = FileRegistry(artifacts / "registry.json")
    assert registry.get(2).state == VersionState.RETIRED  # type: ignore[union-attr]
    code, _, err = _run(capsys, "rollout", "2", "--artifacts", root, "--once")
    assert code == 3 and "version 2 is retired" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["rollout", "abc"], "expected a version number, `candidate` or `status`"),
        (["promote"], "nothing to promote"),
        (["rollout", "7", "--once"], "version 7 has no complete export"),
    ],
)
def test_bad_input_is_one_line_naming_the_problem(
    artifacts: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, _, err = _run(capsys, *argv, "--artifacts", str(artifacts))
    assert code == 3 and message in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0.1,x"], "argument --steps: must be canary weights in (0, 1)"),
        (["--steps", "0.5,0.2"], "none below the one before, got '0.5,0.2'"),
        (["--margin", "2"], "argument --margin: must be a finite number in [0, 1), got '2'"),
        (["--interval-s", "inf"], "argument --interval-s: must be a finite number > 0, got 'inf'"),
        (["--cuped-theta", "x"], "argument --cuped-theta: expected a number > 0 or `fitted`"),
    ],
)
def test_bad_option_values_are_usage_errors_naming_the_option(
    artifacts: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["rollout", "2", "--artifacts", str(artifacts), *argv])
    assert stopped.value.code == 2 and message in capsys.readouterr().err
    assert not (artifacts / "rollout").exists()  # refused before anything was written


def test_a_scheduled_worker_with_no_candidate_exits_cleanly_only_with_if_any(
    artifacts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(artifacts)
    registry = FileRegistry(artifacts / "registry.json")
    registry.transition(2, VersionState.RETIRED, "test: no candidate left")
    code, _, err = _run(capsys, "rollout", "candidate", "--artifacts", root, "--once")
    assert code == 3 and "no candidate to roll out" in err
    code, out, _ = _run(capsys, "rollout", "candidate", "--if-any", "--artifacts", root)
    assert code == 0 and "no candidate to roll out (nothing to do)" in out
    assert FileDesiredState(artifacts / "rollout" / "desired.json").read() is None


def test_a_metrics_port_that_cannot_listen_is_refused_naming_the_options(
    artifacts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        argv = ["rollout", "2", "--artifacts", str(artifacts), "--once", "--metrics-port", port]
        code, _, err = _run(capsys, *argv)
        assert code == 3 and "--metrics-address/--metrics-port: cannot listen on" in err
        assert f"127.0.0.1:{port}" in err and "Traceback" not in err
    code, _, err = _run(capsys, *argv[:-1], "0", "--metrics-address", "no-such-host.invalid")
    assert code == 0  # port 0: no metrics server, the address is not used
    code, _, err = _run(capsys, *argv, "--metrics-address", "no-such-host.invalid")
    assert code == 3 and "cannot listen on no-such-host.invalid" in err


def test_plan_forecasts_from_the_logged_traffic_and_refuse_late_refuses(
    artifacts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio
    import time

    import numpy as np

    from services.serving.gateway import make_store
    from services.settings import Settings
    from tests.unit.control.test_rollout import _traffic

    root = str(artifacts)
    code, out, _ = _run(capsys, "rollout", "2", "--artifacts", root, "--plan")
    assert code == 1 and "no traffic logged in the last 600 s" in out
    assert "steps 5% -> 25% -> 50% (--steps auto's default)" in out

    async def log_traffic() -> None:  # two bursts 0.2 s apart through the embedded store
        settings = Settings(artifacts=artifacts)
        store = make_store(settings.model_copy(update={"streams_dir": settings.embedded_streams()}))
        await store.start()
        rng = np.random.default_rng(0)
        for _ in range(2):
            await _traffic(store, rng, 0.0, {1: 0.05, 2: 0.05}, answers=200)  # type: ignore[arg-type]
            time.sleep(0.2)
        await store.close()

    asyncio.run(log_traffic())
    easy = ("--steps", "0.5", "--margin", "0.5")  # 200 users: only a wide margin decides
    code, out, _ = _run(capsys, "rollout", "2", "--artifacts", root, "--plan", *easy)
    assert code == 0, out  # hundreds of answers a second: the step decides in time
    assert "plan: recent traffic" in out and "plan: step 0 at 50%" in out
    assert "an equivalent candidate decides in about" in out
    code, out, _ = _run(capsys, "rollout", "2", "--artifacts", root, "--plan", "--margin", "0.5")
    chosen = out.split("plan: --steps auto: ")[1].split(",")[0]  # e.g. "25% -> 50%"
    assert f"plan: step 0 at {chosen.split(' -> ')[0]}:" in out
    assert "the smallest first step at which an equivalent candidate decides" in out
    slow = ("--margin", "0.001", "--step-deadline-s", "300")
    code, out, _ = _run(capsys, "rollout", "2", "--artifacts", root, "--plan", *slow)
    assert code == 1 and "a step cannot decide at this user population" in out
    assert "WARNING: this rollout cannot decide within its deadline" in out
    code, out, err = _run(capsys, "rollout", "2", "--artifacts", root, "--refuse-late", *slow)
    assert code == 3 and "would end inconclusive at its deadline" in out + err
    assert FileRegistry(artifacts / "registry.json").get(2).state == VersionState.CANDIDATE  # type: ignore[union-attr]
    # a running rollout keeps the steps it started with: the plan is made for those
    code, out, _ = _run(capsys, "rollout", "2", "--artifacts", root, "--steps", "0.5", "--once")
    assert code == 0 and "step 0 at 50%" in out
    code, out, _ = _run(capsys, "rollout", "2", "--artifacts", root, "--plan")
    assert "plan: step 0 at 50%" in out and "--steps auto" not in out


@pytest.mark.parametrize(
    ("argv", "cuped", "theta"),
    [([], True, 1.0), (["--no-cuped"], False, 1.0), (["--cuped-theta", "fitted"], True, None)],
)
def test_cuped_is_on_with_theta_one_unless_told(
    artifacts: Path, argv: list[str], cuped: bool, theta: float | None
) -> None:
    import argparse

    from cli.rollout import _plan, add_rollout_parser

    parser = argparse.ArgumentParser()
    add_rollout_parser(parser.add_subparsers())
    plan = _plan(parser.parse_args(["rollout", "2", "--artifacts", str(artifacts), *argv]))
    assert (plan.analysis.cuped, plan.analysis.cuped_theta) == (cuped, theta)
