"""`cascade rollback` / `promote` while a controller drives the rollout, and a controller
killed with -9 (issue 30): real controller processes, on a private Redis (a fleet) and on the
embedded stack's files."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from cli.main import main
from control.registry import FileRegistry, RedisRegistry, Registry, VersionState
from services.state.desired_state import make_desired_state_store
from services.util.local_redis import start_redis_server
from tests.integration import control_processes as processes

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    try:
        url, process = start_redis_server(tmp_path_factory.mktemp("redis"))
    except FileNotFoundError:
        pytest.skip("redis-server is not installed (.ci/run installs it)")
    yield url
    process.kill()
    process.wait()


@pytest.fixture(params=["redis", "file"])
def url(request: pytest.FixtureRequest, server: str) -> str | None:
    """The fleet's Redis (emptied), or None: the embedded stack's files."""
    if request.param == "file":
        return None
    redis.Redis.from_url(server).flushdb()
    return server


def _registry(root: Path, url: str | None) -> Registry:
    return FileRegistry(root / "registry.json") if url is None else RedisRegistry(url, "optest")


def _cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], url: str | None, *argv: str
) -> tuple[int, str]:
    monkeypatch.delenv("CASCADE_REDIS__URL", raising=False)
    if url is not None:
        monkeypatch.setenv("CASCADE_REDIS__URL", url)
        monkeypatch.setenv("CASCADE_REDIS__NAMESPACE", processes.NAMESPACE)
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out + err


@pytest.mark.parametrize("action", ["rollback", "promote"])
def test_the_operator_ends_a_rollout_a_controller_drives(
    tmp_path: Path,
    url: str | None,
    action: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = processes.export(tmp_path / "export", url)
    log = processes.rollout_log(root, url)
    controller = processes.controller(tmp_path / "controller", root, url)
    try:
        started = processes.wait_running(controller, log)
        assert controller.alive(), controller.output()
        code, out = _cli(
            monkeypatch, capsys, url, action, "--artifacts", str(root), "--reason", "on-call test"
        )
        assert code == 0, out
        assert f"{action} of rollout {started.id} requested from its controller" in out
        ended = "rolled back" if action == "rollback" else "promoted"
        assert f"{ended} (operator) [on-call test]" in out
        # the controller ended it and exits as after any rollback (1) or promotion (0)
        assert controller.wait(30) == (1 if action == "rollback" else 0), controller.output()
    finally:
        controller.stop()
    record = log.load()
    assert record is not None and record.id == started.id
    assert (record.status, record.reason, record.detail) == (
        "rolled_back" if action == "rollback" else "promoted",
        "operator",
        "on-call test",
    )
    last = log.audit(1)[-1]
    assert (last["event"], last["reason"], last["detail"]) == (
        record.status,
        "operator",
        "on-call test",
    )
    assert log.request() is None  # honoured and cleared
    desired = make_desired_state_store(url, processes.NAMESPACE, root).read()
    assert desired is not None and desired.canary is None
    assert desired.production == (1 if action == "rollback" else 2)
    registry = _registry(root, url)
    expected = VersionState.RETIRED if action == "rollback" else VersionState.PRODUCTION
    assert registry.get(2).state is expected  # type: ignore[union-attr]
    registry.close()


def test_rollback_with_no_controller_acts_itself_and_then_undoes_the_promotion(
    tmp_path: Path,
    url: str | None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = processes.export(tmp_path / "export", url)
    code, out = _cli(monkeypatch, capsys, url, "rollout", "2", "--artifacts", str(root), "--once")
    assert code == 0, out
    code, out = _cli(monkeypatch, capsys, url, "promote", "--artifacts", str(root))
    assert code == 0 and "promoted (operator) [manual]" in out and "requested" not in out
    code, out = _cli(monkeypatch, capsys, url, "rollback", "--artifacts", str(root))
    assert code == 0 and "serving production 1" in out  # no rollout: the promotion undone
    registry = _registry(root, url)
    assert registry.production() == 1
    registry.close()


def test_a_controller_killed_with_9_frees_its_lock_within_its_ttl(
    tmp_path: Path, server: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    redis.Redis.from_url(server).flushdb()
    root = processes.export(tmp_path / "export", server)
    log = processes.rollout_log(root, server)
    key = f"{processes.NAMESPACE}:registry:lock:rollout"
    client = redis.Redis.from_url(server)
    ttl_s = 2.0
    controller = processes.controller(
        tmp_path / "controller", root, server, "--lock-ttl", str(ttl_s)
    )
    try:
        started = processes.wait_running(controller, log)
        for _ in range(30):  # 3 s, 1.5 ttls: its heartbeat keeps the lock
            assert client.get(key) is not None, controller.output()
            time.sleep(0.1)
        holder = json.loads(client.get(key))["holder"]  # type: ignore[arg-type]
        assert holder.endswith(f":{controller.process.pid}")
        controller.kill()
        assert client.pttl(key) <= ttl_s * 1000  # it outlives the crash by at most its ttl
        argv = ("rollout", "2", "--artifacts", str(root), "--once")
        code, out = _cli(monkeypatch, capsys, server, *argv)
        assert code != 0 and "lock 'rollout' is held" in out  # the dead one's, for now
        # the next controller takes it within the ttl (generous bound: the ttl + 5 s)
        resumed = processes.wait_until(
            lambda: _cli(monkeypatch, capsys, server, *argv)[0] == 0, ttl_s + 5, "the lock"
        )
        assert resumed
    finally:
        controller.stop()
    record = log.load()
    assert record is not None and record.id == started.id and record.status == "running"
    assert record.looks > started.looks  # the same rollout, resumed
