"""Hygiene for a server process this process launches (Linux): it dies with its parent, its
ports are checked free before it starts, and who listens on a port can be verified.

``die_with_parent`` is a ``preexec_fn``: ``prctl(PR_SET_PDEATHSIG)`` makes the kernel signal
the child when the *thread* that forked it exits, so launch from a thread that lives as long
as the child (see ``services.inference.triton_server``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG = 1
_LISTEN = "0A"  # TCP state in /proc/net/tcp*


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` that asks the kernel to send ``sig`` to the child when its parent
    (thread) exits; the child exits at once if the parent died before the call."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before the fork
    parent = os.getpid()

    def preexec() -> None:
        if prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            os._exit(126)
        if os.getppid() != parent:  # orphaned between fork and prctl
            os._exit(0)

    return preexec


def port_in_use(address: str, port: int) -> bool:
    """True when a socket already listens on ``address:port`` (or on a wildcard address
    covering it). TIME_WAIT leftovers do not count (SO_REUSEADDR, as servers set it)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    mapped = words[:12] == b"\0" * 10 + b"\xff\xff"
    if mapped:
        return socket.inet_ntop(socket.AF_INET, words[12:])
    return socket.inet_ntop(socket.AF_INET6, words)


def listening_sockets() -> dict[int, tuple[str, int]]:
    """Socket inode -> ``(address, port)`` of every listening TCP socket of this network
    namespace (IPv4-mapped IPv6 addresses are shown as IPv4)."""
    found: dict[int, tuple[str, int]] = {}
    for table in (Path("/proc/net/tcp"), Path("/proc/net/tcp6")):
        if not table.is_file():
            continue
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != _LISTEN:
                continue
            address, port = fields[1].split(":")
            found[int(fields[9])] = (_address(address), int(port, 16))
    return found


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """``(address, port)`` of the TCP sockets process ``pid`` listens on (empty when it is
    gone or not ours to inspect)."""
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        return set()
    return {where for inode, where in listening_sockets().items() if inode in inodes}
