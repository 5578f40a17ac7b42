"""A gateway app served by uvicorn in a thread on a free loopback port, for tests (and
benchmarks) that talk to it over real HTTP (the simulator, Prometheus scrapes, Alertmanager's
webhook calls), with the setup and readings those share."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import uvicorn

from services.api.app import create_app
from services.api.server import server_config
from services.serving.gateway import Gateway
from services.settings import Settings
from services.util.local_redis import free_port


@contextmanager
def served_app(settings: Settings, gateway: Gateway | None = None) -> Iterator[str]:
    """Serve ``create_app`` (around ``gateway`` when given) until the block ends; yields the
    base URL once the server accepts connections (fails the test if it does not start)."""
    app = create_app(gateway=gateway) if gateway is not None else create_app(settings)
    port = free_port()
    server = uvicorn.Server(server_config(app, "127.0.0.1", port, settings))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the gateway did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


def export_copy_with_admin_token(exported: Path, directory: Path, token: str) -> tuple[Path, Path]:
    """A writable copy of an export root (without its work and retrain state) and a file
    holding the admin token (mode 0600), as a gateway behind Alertmanager's webhook has."""
    artifacts = directory / "artifacts"
    shutil.copytree(exported, artifacts, ignore=shutil.ignore_patterns("work", "retrain"))
    token_file = directory / "admin-token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    return artifacts, token_file


def retrain_decisions(url: str) -> dict[str, float]:
    """The gateway's ``cascade_retrain_requests_total`` by decision (a per-process counter:
    compare against a reading taken at the start of a test)."""
    found = {}
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith("cascade_retrain_requests_total{"):
            name = line.split('decision="', 1)[1].split('"', 1)[0]
            found[name] = float(line.rsplit(" ", 1)[1])
    return found


def wait_until_ready(
    process: subprocess.Popen[bytes], url: str, timeout_s: float = 180, output: Path | None = None
) -> None:
    """Poll ``url``/health/ready (a ``cascade serve`` started as a process) until it answers
    200; fail the test when the process exits first or the time runs out, with the end of
    ``output`` (where the process writes) in the message."""
    deadline = time.monotonic() + timeout_s
    while True:
        said = output.read_text(errors="replace")[-3000:] if output is not None else ""
        assert process.poll() is None, f"cascade serve exited ({process.returncode}):\n{said}"
        assert time.monotonic() < deadline, f"the gateway did not become ready:\n{said}"
        try:
            if httpx.get(f"{url}/health/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
