"""free_port: ports taken one after another before any is bound are all different (a Triton
given the same port for gRPC and metrics refused to start)."""

from __future__ import annotations

import socket

from services.util.local_redis import free_port


def test_ports_taken_in_a_row_differ_and_are_free() -> None:
    ports = [free_port() for _ in range(100)]
    assert len(set(ports)) == len(ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # free: nothing listens on it
