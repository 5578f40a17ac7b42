"""`cascade rollback` / `promote` when the controller holding the rollout lock does not act
(issue 30): the embedded stack's files, the lock held by the test itself."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from cli.main import main
from cli.operator import _honoured
from control.registry import FileRegistry
from control.rollout.controller import RolloutRefused
from control.rollout.state import FileRolloutLog, RolloutRecord
from tests.unit.control.fake_exports import production_and_candidate


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    return production_and_candidate(tmp_path / "artifacts")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out + err


def test_a_controller_that_does_not_act_leaves_the_request_standing(
    artifacts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(artifacts)
    code, out = _run(capsys, "rollout", "2", "--artifacts", root, "--once")
    assert code == 0, out
    with FileRegistry(artifacts / "registry.json").lock("rollout", ttl_s=30):  # a stuck one
        code, out = _run(capsys, "rollback", "--artifacts", root, "--wait-s", "0.5")
    assert code != 0 and "requested from its controller" in out
    assert "the controller did not rollback rollout " in out and "the request stands" in out
    log = FileRolloutLog(artifacts / "rollout")
    request = log.request()
    record = log.load()
    assert record is not None and record.status == "running"
    assert request is not None and (request.action, request.rollout) == ("rollback", record.id)
    code, out = _run(capsys, "rollback", "--artifacts", root)  # the lock is free: acts itself
    assert code == 0 and "rolled back (operator) [manual]" in out
    assert log.request() is None


def test_a_held_lock_without_a_running_rollout_is_refused_after_the_wait(
    artifacts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with FileRegistry(artifacts / "registry.json").lock("rollout", ttl_s=30):
        code, out = _run(capsys, "promote", "--artifacts", str(artifacts), "--wait-s", "0.3")
    assert code != 0 and "lock 'rollout' is held by" in out
    assert "no rollout is running for it to promote" in out and "Traceback" not in out


def test_an_unreachable_rollout_store_is_one_line(
    artifacts: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable(self: FileRolloutLog) -> None:
        raise RedisConnectionError("Connection refused")

    monkeypatch.setattr(FileRolloutLog, "load", unreachable)
    code, out = _run(capsys, "rollback", "--artifacts", str(artifacts))
    assert code != 0 and "rollback: the rollout's store cannot be reached" in out
    assert "Traceback" not in out


@pytest.mark.parametrize(
    ("status", "action", "message"),
    [
        ("promoted", "rollback", "was promoted (kpi_pass) before its controller saw the rollback"),
        ("rolled_back", "promote", "was rolled back (kpi_pass) before its controller saw the"),
    ],
)
def test_a_rollout_that_ended_otherwise_before_the_request_is_said_so(
    status: str, action: str, message: str
) -> None:
    record = RolloutRecord(id="r1", version=2, production=1, weights=[0.5], reason="kpi_pass")
    record.status = status  # type: ignore[assignment]
    with pytest.raises(RolloutRefused, match=re.escape(message)):
        _honoured(record, action)  # type: ignore[arg-type]
