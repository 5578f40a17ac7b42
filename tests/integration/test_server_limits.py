"""The HTTP server's limits against hostile or broken clients (issue 8, item 9): a real
uvicorn with the guarded protocol on a loopback port, raw sockets as the clients."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from services.api.server import server_config
from services.settings import ServerSettings, Settings
from services.util.local_redis import free_port

pytestmark = pytest.mark.integration


async def _hello(scope: dict, receive: object, send: object) -> None:
    """The smallest ASGI app: 200 'ok' (the limits are the server's, not the app's)."""
    if scope["type"] != "http":
        return
    status = 204 if scope["path"] == "/empty" else 200
    headers = [] if status == 204 else [(b"content-length", b"2")]
    await send({"type": "http.response.start", "status": status, "headers": headers})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": b"" if status == 204 else b"ok"})  # type: ignore[operator]


@pytest.fixture
def server() -> Iterator[int]:
    limits = ServerSettings(max_header_bytes=4096, header_timeout_s=0.5, max_connections=4)
    port = free_port()
    config = server_config(_hello, "127.0.0.1", port, Settings(server=limits))
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not uv.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield port
    uv.should_exit = True
    thread.join(10)


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_an_ordinary_request_is_served(server: int) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        assert _read_all(sock).startswith(b"HTTP/1.1 200")


def test_an_unterminated_huge_header_gets_431_and_is_closed(server: int) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nhost: x\r\nx-pad: ")
        try:
            for _ in range(64):  # up to 4 MiB, never terminated
                sock.sendall(b"a" * 65536)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed on us while we were still sending: that is the point
        try:
            reply = _read_all(sock)
        except ConnectionResetError:
            reply = b"HTTP/1.1 431"  # reset before we read: the reply was discarded
        assert reply.startswith(b"HTTP/1.1 431")


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(
    server: int,
) -> None:
    with _connect(server) as sock:
        started = time.monotonic()
        reply = _read_all(sock)  # returns when the server closes
        assert reply.startswith(b"HTTP/1.1 408")
        assert time.monotonic() - started < 4


def test_a_slow_header_is_cut_at_the_timeout(server: int) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\n")
        time.sleep(0.3)
        sock.sendall(b"host: x\r\n")  # a trickle, never the blank line
        assert _read_all(sock).startswith(b"HTTP/1.1 408")


def test_connections_beyond_the_cap_are_refused(server: int) -> None:
    idle = [_connect(server) for _ in range(4)]
    try:
        time.sleep(0.1)
        with _connect(server) as extra:
            assert _read_all(extra).startswith(b"HTTP/1.1 503")
    finally:
        for sock in idle:
            sock.close()


def test_sigterm_with_a_stalled_client_stops_within_the_grace_period(
    exported: Path, tmp_path: Path
) -> None:
    """`cascade serve` with a client that sent headers but never its body: SIGTERM ends the
    server after CASCADE_SERVER__GRACEFUL_SHUTDOWN_S, not whenever the client pleases."""
    port = free_port()
    env = {
        **os.environ,
        "CASCADE_ARTIFACTS": str(exported),
        "CASCADE_SERVER__GRACEFUL_SHUTDOWN_S": "1",
    }
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "serve", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while b"gateway ready" not in (tmp_path / "serve.log").read_bytes():
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        # the port is bound before the app starts: once "gateway ready" is logged, a client
        # connects at the first try
        logged = (tmp_path / "serve.log").read_bytes()
        assert logged.index(b"listening on") < logged.index(b"gateway ready"), logged
        stalled = _connect(port)
        stalled.sendall(
            b"POST /v1/recommend HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 100\r\n\r\n{"
        )
        time.sleep(0.3)
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=15)
        assert time.monotonic() - started < 8
        stalled.close()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()


def _read_head(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.parametrize(
    ("request_line", "status"),
    [("GET / HTTP/1.1", b"200"), ("HEAD / HTTP/1.1", b"200"), ("GET /empty HTTP/1.1", b"204")],
)
def test_answers_without_a_body_write_are_not_held_back(
    server: int, request_line: str, status: bytes
) -> None:
    """The server sends a response head together with the body; a response with no body
    write (HEAD, 204) must still go out at once, on a connection kept alive."""
    with _connect(server) as sock:
        for _ in range(2):  # and the next request on the same connection
            sock.sendall(f"{request_line}\r\nhost: x\r\n\r\n".encode())
            data = _read_head(sock)
            assert data.startswith(b"HTTP/1.1 " + status), data
            _, _, body = data.partition(b"\r\n\r\n")
            if request_line.startswith("GET / "):  # the body, however it was split
                while len(body) < 2:
                    body += sock.recv(65536)
                assert body == b"ok"
            else:
                assert body == b""
