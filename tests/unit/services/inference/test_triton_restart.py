"""A restarted Triton starts empty and loads only what nobody claimed within the grace
(``TritonServer._after_restart``), against a stand-in for Triton's repository API (the real
server: tests/integration/test_fleet.py and test_triton_server.py)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from services.inference.triton import CONTROL_KEY_HEADER
from services.inference.triton_server import TritonServer


class Repository(ThreadingHTTPServer):
    """Answers the repository index with ``entries`` and records every load."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.entries: list[dict[str, Any]] = []
        self.loads: list[tuple[str, str | None]] = []  # (model, control key sent)
        self.index_keys: list[str | None] = []


class Handler(BaseHTTPRequestHandler):
    server: Repository

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        key = self.headers.get(CONTROL_KEY_HEADER)
        if self.path == "/v2/repository/index":
            self.server.index_keys.append(key)
            body = json.dumps(self.server.entries).encode()
        elif self.path.startswith("/v2/repository/models/") and self.path.endswith("/load"):
            self.server.loads.append((self.path.split("/")[4], key))
            body = b"{}"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class Running:
    """A launched process that has not exited (or has, with ``code``)."""

    def __init__(self, code: int | None = None) -> None:
        self.code = code

    def poll(self) -> int | None:
        return self.code


@pytest.fixture
def repository() -> Iterator[Repository]:
    server = Repository()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _triton(repository: Repository, tmp_path: Path, grace_s: float = 0.01) -> TritonServer:
    return TritonServer(
        tmp_path,
        models=("query_tower", "ranker"),
        http_port=repository.server_address[1],
        control_key="key",
        restart_load_grace_s=grace_s,
    )


def test_a_restart_loads_only_the_models_nobody_loaded(
    repository: Repository, tmp_path: Path
) -> None:
    repository.entries = [
        {"name": "ranker", "version": "1", "state": "READY"},
        {"name": "ranker", "version": "2", "state": "LOADING"},
        {"name": "query_tower", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
    ]
    _triton(repository, tmp_path)._after_restart(Running())  # type: ignore[arg-type]
    assert repository.index_keys == ["key"]
    assert repository.loads == [("query_tower", "key")]  # the repository's default


def test_a_model_loading_counts_as_claimed(repository: Repository, tmp_path: Path) -> None:
    repository.entries = [
        {"name": "ranker", "version": "2", "state": "LOADING"},
        {"name": "query_tower", "version": "1", "state": "READY"},
    ]
    _triton(repository, tmp_path)._after_restart(Running())  # type: ignore[arg-type]
    assert repository.loads == []


def test_nothing_is_loaded_into_a_server_that_died_or_was_stopped(
    repository: Repository, tmp_path: Path
) -> None:
    _triton(repository, tmp_path)._after_restart(Running(code=-9))  # type: ignore[arg-type]
    stopped = _triton(repository, tmp_path, grace_s=60)
    stopped._stopping.set()  # stop() during the grace
    stopped._after_restart(Running())  # type: ignore[arg-type]
    assert repository.index_keys == [] and repository.loads == []


def test_an_unreachable_server_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = TritonServer(tmp_path, http_port=1, restart_load_grace_s=0.01)
    server._after_restart(Running())  # type: ignore[arg-type]
    assert "cannot be listed" in caplog.text


def test_only_the_first_launch_loads_models_at_start(tmp_path: Path) -> None:
    server = TritonServer(tmp_path, models=("ranker",))
    assert "--load-model=ranker" in server.command(tmp_path)
    assert not any(a.startswith("--load-model") for a in server.command(tmp_path, 2, False))
    assert "--disable-auto-complete-config" in server.command(tmp_path)
