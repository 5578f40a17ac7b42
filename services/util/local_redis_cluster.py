"""A private, throw-away Redis Cluster on free loopback ports (tests and benchmarks): N
``redis-server --cluster-enabled yes`` primaries, no replicas, nothing persisted; each node's
cluster bus on a free port of its own (the default, port + 10000, may be taken or too high)."""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from services.util.local_redis import free_port


@dataclass
class LocalCluster:
    """The nodes' ports and processes; ``url`` names the first node (any one will do)."""

    ports: list[int]
    processes: list[subprocess.Popen[bytes]] = field(repr=False)

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.ports[0]}/0"

    def node_urls(self) -> list[str]:
        return [f"redis://127.0.0.1:{port}/0" for port in self.ports]

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
        for process in self.processes:
            process.wait()


def start_redis_cluster(directory: Path, nodes: int = 3, timeout_s: float = 20.0) -> LocalCluster:
    """Start ``nodes`` cluster-enabled servers in ``directory``, join them with
    ``redis-cli --cluster create`` (slots split evenly, no replicas) and wait for
    ``cluster_state:ok`` on every node. The caller stops it. Raises FileNotFoundError without
    redis-server or redis-cli, TimeoutError when the cluster does not form."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        raise FileNotFoundError("redis-server and redis-cli are needed for a Redis Cluster")
    ports = [free_port() for _ in range(nodes)]
    processes: list[subprocess.Popen[bytes]] = []
    cluster = LocalCluster(ports, processes)
    try:
        for port in ports:
            node_dir = directory / str(port)
            node_dir.mkdir(parents=True, exist_ok=True)
            bus = free_port()  # the cluster bus: not port + 10000, which may be taken
            command = [server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(node_dir)]
            command += ["--cluster-enabled", "yes", "--cluster-port", str(bus)]
            command += ["--cluster-config-file", str(node_dir / "nodes.conf")]
            command += ["--save", "", "--appendonly", "no"]
            processes.append(
                subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
        deadline = time.monotonic() + timeout_s
        for port in ports:
            _wait(cli, port, "PING", b"PONG", deadline)
        subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports), "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=timeout_s,
        )
        for port in ports:
            _wait(cli, port, "CLUSTER INFO", b"cluster_state:ok", deadline)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait(cli: str, port: int, command: str, expected: bytes, deadline: float) -> None:
    while True:
        reply = subprocess.run(
            [cli, "-p", str(port), *command.split()], capture_output=True, timeout=5
        ).stdout
        if expected in reply:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"redis node {port}: no {expected.decode()!r} after {command}")
        time.sleep(0.05)
