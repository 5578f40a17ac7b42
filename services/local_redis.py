"""A private, throw-away redis-server on a free loopback port (benchmarks and fault tests)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis_server(
    directory: Path, timeout_s: float = 5.0
) -> tuple[str, subprocess.Popen[bytes]]:
    """Start ``redis-server`` (nothing persisted) and wait until it accepts connections.

    Returns its URL and process; the caller stops it. Raises FileNotFoundError when the
    binary is not installed, TimeoutError when it does not come up.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        raise FileNotFoundError("redis-server is not installed")
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
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
            return f"redis://127.0.0.1:{port}/0", process
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise TimeoutError(f"redis-server did not listen on port {port} within {timeout_s} s")
