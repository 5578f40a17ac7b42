"""A private, throw-away durable Redis with failover on free loopback ports (tests and
benchmarks): a primary with append-only persistence, one replica, and three Sentinels that
watch them (quorum 2) and promote the replica when the primary stops answering."""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from services.util.local_redis import free_port

SERVICE = "cascade"  # the primary's name at the Sentinels
DOWN_AFTER_MS = 1_000  # a primary silent this long is down (the production default: 30 s)


@dataclass
class LocalSentinel:
    """The servers' and Sentinels' ports and processes."""

    primary_port: int
    replica_port: int
    sentinel_ports: list[int]
    processes: dict[int, subprocess.Popen[bytes]] = field(repr=False)

    @property
    def url(self) -> str:
        """The durable role's URL: the Sentinels, the service, db 0."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def kill(self, port: int) -> None:
        """SIGKILL the server on ``port`` (a primary that dies without a word)."""
        self.processes[port].kill()
        self.processes[port].wait()

    def stop(self) -> None:
        for process in self.processes.values():
            process.kill()
        for process in self.processes.values():
            process.wait()


def _redis_cli(port: int, *command: str) -> str:
    done = subprocess.run(
        ["redis-cli", "-p", str(port), *command], capture_output=True, text=True, timeout=5
    )
    return done.stdout


def start_redis_sentinel(directory: Path, timeout_s: float = 20.0) -> LocalSentinel:
    """Start the primary, its replica and three Sentinels in ``directory`` and wait until the
    replica is in sync and every Sentinel knows the replica and the other Sentinels. The
    caller stops it. Raises FileNotFoundError without redis-server or redis-cli,
    TimeoutError when it does not form."""
    server = shutil.which("redis-server")
    if server is None or shutil.which("redis-cli") is None:
        raise FileNotFoundError("redis-server and redis-cli are needed for Redis Sentinel")
    primary, replica = free_port(), free_port()
    sentinels = [free_port() for _ in range(3)]
    setup = LocalSentinel(primary, replica, sentinels, {})
    try:
        for port in (primary, replica):
            node = directory / str(port)
            node.mkdir(parents=True, exist_ok=True)
            command = [server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(node)]
            command += ["--save", "", "--appendonly", "yes"]
            if port == replica:
                command += ["--replicaof", "127.0.0.1", str(primary)]
            setup.processes[port] = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        for port in sentinels:
            config = directory / f"sentinel-{port}.conf"  # a Sentinel rewrites its own file
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {directory}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {primary} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} 5000\n"
            )
            setup.processes[port] = subprocess.Popen(
                [server, str(config), "--sentinel"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            synced = "master_link_status:up" in _redis_cli(replica, "info", "replication")
            known = all(  # the replica, and the other Sentinels (for the election)
                str(replica) in _redis_cli(port, "sentinel", "replicas", SERVICE)
                and all(
                    str(other) in _redis_cli(port, "sentinel", "sentinels", SERVICE)
                    for other in sentinels
                    if other != port
                )
                for port in sentinels
            )
            if synced and known:
                return setup
            time.sleep(0.2)
        raise TimeoutError(f"the Sentinel setup did not form within {timeout_s} s")
    except BaseException:
        setup.stop()
        raise
