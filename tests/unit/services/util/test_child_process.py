"""Process hygiene for launched servers: parent-death signal, port checks, socket owners."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.util.child_process import die_with_parent, listening_addresses, port_in_use


def test_a_listening_port_is_in_use_and_a_closed_one_is_not() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert port_in_use("127.0.0.1", port)
        assert listening_addresses(os.getpid()) >= {("127.0.0.1", port)}
    assert not port_in_use("127.0.0.1", port)
    assert ("127.0.0.1", port) not in listening_addresses(os.getpid())


def test_a_wildcard_listener_takes_the_port_of_every_address() -> None:
    with socket.socket() as server:
        server.bind(("0.0.0.0", 0))
        server.listen()
        port = server.getsockname()[1]
        assert port_in_use("127.0.0.1", port)
        assert ("0.0.0.0", port) in listening_addresses(os.getpid())


def test_port_check_raises_other_bind_errors() -> None:
    with pytest.raises(OSError):
        port_in_use("192.0.2.1", 8000)  # TEST-NET address: not ours, EADDRNOTAVAIL


def test_a_gone_process_listens_on_nothing() -> None:
    assert listening_addresses(2**22 + 1) == set()


def test_the_child_dies_with_the_parent(tmp_path: Path) -> None:
    """A parent launches `sleep` with the parent-death signal, then is SIGKILLed."""
    pid_file = tmp_path / "pid"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "from services.util.child_process import die_with_parent\n"
            "child = subprocess.Popen(['sleep', '300'], preexec_fn=die_with_parent())\n"
            f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
            "time.sleep(300)\n",
        ]
    )
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child = int(pid_file.read_text())
    assert _alive(child)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_die_with_parent_is_a_no_op_for_a_live_parent() -> None:
    child = subprocess.Popen(["true"], preexec_fn=die_with_parent())
    assert child.wait(timeout=10) == 0


def _alive(pid: int) -> bool:
    """Running (a zombie left for init to reap counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
