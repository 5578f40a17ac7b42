"""What only the file registry does: pid-aware locks, a corrupt file, and the backend choice."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from control.registry import (
    FileRegistry,
    LockHeld,
    RedisRegistry,
    RegistryError,
    make_registry,
)
from services.settings import RedisSettings, Settings


def _plant_lock(path: Path, host: str, pid: int, ttl_s: float) -> None:
    """A lock as another process would have left it in the registry file."""
    state = json.loads(path.read_text()) if path.exists() else {"versions": {}}
    state.setdefault("locks", {})["retrain"] = {
        "token": "theirs",
        "holder": f"{host}:{pid}",
        "until": time.time() + ttl_s,
        "host": host,
        "pid": pid,
    }
    path.write_text(json.dumps(state))


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_a_live_holder_on_this_host_keeps_its_lock(tmp_path: Path) -> None:
    registry = FileRegistry(tmp_path / "registry.json")
    _plant_lock(registry.path, socket.gethostname(), os.getppid(), ttl_s=60)
    held_by = f"held by {socket.gethostname()}:{os.getppid()}"
    with pytest.raises(LockHeld, match=held_by), registry.lock("retrain", ttl_s=5):
        pass


def test_a_dead_holder_on_this_host_frees_its_lock_before_the_ttl(tmp_path: Path) -> None:
    registry = FileRegistry(tmp_path / "registry.json")
    _plant_lock(registry.path, socket.gethostname(), _dead_pid(), ttl_s=60)
    with registry.lock("retrain", ttl_s=5) as held:
        assert held.holder.endswith(f":{os.getpid()}")
    assert "retrain" not in json.loads(registry.path.read_text())["locks"]


def test_a_holder_on_another_host_is_trusted_until_its_ttl(tmp_path: Path) -> None:
    registry = FileRegistry(tmp_path / "registry.json")
    _plant_lock(registry.path, "elsewhere", _dead_pid(), ttl_s=60)  # its pid means nothing here
    with pytest.raises(LockHeld, match="held by elsewhere:"), registry.lock("retrain", ttl_s=5):
        pass
    _plant_lock(registry.path, "elsewhere", 1, ttl_s=-1)  # expired
    with registry.lock("retrain", ttl_s=5):
        pass


def test_a_corrupt_registry_file_is_an_error_naming_it(tmp_path: Path) -> None:
    registry = FileRegistry(tmp_path / "registry.json")
    registry.path.write_text("{not json")
    with pytest.raises(RegistryError, match=r"registry\.json: unreadable registry"):
        registry.records()


def test_a_lock_name_must_be_simple(tmp_path: Path) -> None:
    registry = FileRegistry(tmp_path / "registry.json")
    with pytest.raises(RegistryError, match="names are"), registry.lock("a:b", ttl_s=5):
        pass


def test_make_registry_uses_redis_when_configured(tmp_path: Path) -> None:
    embedded = make_registry(Settings(artifacts=tmp_path))
    assert isinstance(embedded, FileRegistry) and embedded.path == tmp_path / "registry.json"
    shared = make_registry(
        Settings(artifacts=tmp_path, redis=RedisSettings(url="redis://h:1/2", namespace="ns"))
    )
    assert isinstance(shared, RedisRegistry)
    assert (shared.url, shared.state_key) == ("redis://h:1/2", "ns:registry:state")


def test_an_unreachable_redis_is_a_registry_error_without_the_password() -> None:
    registry = RedisRegistry("redis://:secret@127.0.0.1:1/0", timeout_s=0.2)
    with pytest.raises(
        RegistryError, match=r"registry at redis://:\*\*\*@127\.0\.0\.1:1/0"
    ) as info:
        registry.records()
    assert "secret" not in str(info.value)


def test_an_unknown_state_is_a_registry_error(tmp_path: Path) -> None:
    registry = FileRegistry(tmp_path / "registry.json")
    with pytest.raises(RegistryError, match="version 1: no state 'live'"):
        registry.transition(1, "live", "typo")  # type: ignore[arg-type]
