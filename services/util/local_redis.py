"""A private, throw-away redis-server on a free loopback port (benchmarks and fault tests)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections import deque
from pathlib import Path

_HANDED_OUT: deque[int] = deque(maxlen=256)  # this process's last ports, not yet all bound


def free_port() -> int:
    """A TCP port nothing listens on right now, and none of the last 256 this process was
    given: callers take several before binding any (Triton's HTTP, gRPC and metrics ports),
    and the kernel may offer a port it just released again."""
    for _ in range(64):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.append(port)
            return port
    raise OSError("no free loopback port that this process was not given already")


def start_redis_server(
    directory: Path,
    timeout_s: float = 5.0,
    port: int | None = None,
    persist: bool = False,
    password: str | None = None,
) -> tuple[str, subprocess.Popen[bytes]]:
    """Start ``redis-server`` and wait until it accepts connections: nothing persisted, or
    with ``persist`` an append-only file in ``directory`` (fsync every second), so a
    restart on the same ``port`` and ``directory`` finds the data again.

    Returns its URL and process; the caller stops it. Raises FileNotFoundError when the
    binary is not installed, TimeoutError when it does not come up.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        raise FileNotFoundError("redis-server is not installed")
    port = port or free_port()
    aof = (
        ["--appendonly", "yes", "--appendfsync", "everysec"] if persist else ["--appendonly", "no"]
    )
    auth = ["--requirepass", password] if password else []
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            *aof,
            *auth,
            "--dir",
            str(directory),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            credentials = f":{password}@" if password else ""
            return f"redis://{credentials}127.0.0.1:{port}/0", process
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise TimeoutError(f"redis-server did not listen on port {port} within {timeout_s} s")
