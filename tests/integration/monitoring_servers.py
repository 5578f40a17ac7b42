"""Real Prometheus and Alertmanager for tests, on free loopback ports in temporary directories.

- ``start_prometheus(directory, targets, rule_files, alertmanager=...)``: a Prometheus that
  scrapes ``targets`` (job name -> ``host:port`` list) every second, evaluates ``rule_files``
  every second and sends its alerts to an Alertmanager; ``Prometheus.query`` runs an instant
  query, ``Prometheus.alerts`` lists pending and firing alerts.
- ``start_alertmanager(directory, config)``: an Alertmanager with a config given as a dict
  (clustering off: it listens on loopback only).
- ``rules_for_tests(...)``: the repository's rule files with every ``for:`` shortened, so a
  test waits seconds where production waits minutes (promtool's tests cover the real values).
- ``require_binary(name)``: the binary's path; skips the test when it is missing, except under
  ``CI`` (which installs the Debian packages ``prometheus`` and ``prometheus-alertmanager``),
  where a missing binary fails it.

The fixtures ``prometheus_server`` and ``alertmanager_server`` (factories that stop what they
started) are registered in ``tests/integration/conftest.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from services.util.local_redis import free_port

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "monitoring" / "prometheus"
RULE_FILES = (RULES / "recording_rules.yml", RULES / "alert_rules.yml")
ALERTMANAGER_CONFIG = REPO / "monitoring" / "alertmanager" / "alertmanager.yml"
ALERTMANAGER_BINARIES = ("prometheus-alertmanager", "alertmanager")  # Debian's name first
T = TypeVar("T")


def require_binary(*names: str) -> str:
    """The path of the first of ``names`` on PATH; skip (fail under CI) when none is."""
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    message = (
        f"{' / '.join(names)} is not installed (Debian packages prometheus, "
        "prometheus-alertmanager)"
    )
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI installs them", pytrace=False)
    pytest.skip(message)


def wait_until(
    check: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.25
) -> T:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


@dataclass
class Server:
    """A started server process: its base URL, directory and log file."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    directory: Path
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.directory / f"{self.name}.log"

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.is_file() else ""

    def get(self, path: str, **params: Any) -> Any:
        """GET an API path; the ``data`` of Prometheus-style answers, else the JSON."""
        response = httpx.get(f"{self.url}{path}", params=params, timeout=10)
        response.raise_for_status()
        body = response.json()
        return body["data"] if isinstance(body, dict) and "data" in body else body

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        def ready() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited:\n{self.log_tail()}")
            try:
                return httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, timeout_s, f"{self.name} to be ready")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


class Prometheus(Server):
    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector (``[{"metric": {...}, "value": [t, "v"]}, ...]``)."""
        data = self.get("/api/v1/query", query=expr)
        return list(data["result"])

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (state pending or firing) with their labels."""
        return list(self.get("/api/v1/alerts")["alerts"])

    def targets_up(self) -> bool:
        active = self.get("/api/v1/targets")["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)


class Alertmanager(Server):
    def alerts(self) -> list[dict[str, Any]]:
        return list(self.get("/api/v2/alerts"))


def _launch(name: str, command: list[str], directory: Path) -> subprocess.Popen[bytes]:
    log = (directory / f"{name}.log").open("wb")
    try:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=directory)
    finally:
        log.close()


ServerT = TypeVar("ServerT", bound="Server")


def _ready(server: ServerT) -> ServerT:
    """The started server once it answers; stopped (and the error raised) if it never does."""
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


def start_prometheus(
    directory: Path,
    targets: dict[str, list[str]],
    rule_files: list[Path] | tuple[Path, ...] = RULE_FILES,
    alertmanager: str | None = None,
    interval: str = "1s",
) -> Prometheus:
    """Start Prometheus (see the module docstring) and wait until it is ready."""
    binary = require_binary("prometheus")
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config: dict[str, Any] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(Path(p).resolve()) for p in rule_files],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": list(hosts)}]}
            for job, hosts in targets.items()
        ],
    }
    if alertmanager is not None:
        host = alertmanager.split("//", 1)[-1].rstrip("/")
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [host]}]}]}
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{port}"
    command = [
        binary,
        f"--config.file={directory / 'prometheus.yml'}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        f"--rules.alert.resend-delay={interval}",
        "--log.level=warn",
    ]
    return _ready(
        Prometheus("prometheus", url, _launch("prometheus", command, directory), directory)
    )


def start_alertmanager(directory: Path, config: dict[str, Any]) -> Alertmanager:
    """Start Alertmanager with ``config`` (clustering off) and wait until it is ready."""
    binary = require_binary(*ALERTMANAGER_BINARIES)
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    (directory / "alertmanager.yml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{port}"
    command = [
        binary,
        f"--config.file={directory / 'alertmanager.yml'}",
        f"--storage.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",  # no gossip port (it would listen on 0.0.0.0:9094)
        "--log.level=warn",
    ]
    return _ready(
        Alertmanager("alertmanager", url, _launch("alertmanager", command, directory), directory)
    )


def _shorten(rules: list[dict[str, Any]], for_: str) -> None:
    for rule in rules:
        if "for" in rule:
            rule["for"] = for_


def rules_for_tests(
    directory: Path, for_: str = "2s", thresholds: dict[str, float] | None = None
) -> list[Path]:
    """The repository's rule files, copied to ``directory`` with every ``for:`` = ``for_``
    and the named ``cascade:threshold:<name>`` constants replaced (e.g. a smaller minimum
    sample, so a test reaches it in seconds)."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    replaced = dict(thresholds or {})
    for source in RULE_FILES:
        content = yaml.safe_load(source.read_text())
        for group in content["groups"]:
            _shorten(group["rules"], for_)
            for rule in group["rules"]:
                name = rule.get("record", "").removeprefix("cascade:threshold:")
                if rule.get("record", "").startswith("cascade:threshold:") and name in replaced:
                    rule["expr"] = f"vector({replaced.pop(name)})"
        target = directory / source.name
        target.write_text(yaml.safe_dump(content, sort_keys=False))
        written.append(target)
    if replaced:
        raise ValueError(f"no threshold series named {sorted(replaced)}")
    return written


def alertmanager_config_for_tests(
    webhook_url: str, token_file: Path, timings: dict[str, str] | None = None
) -> dict[str, Any]:
    """The repository's Alertmanager config with the webhook pointed at ``webhook_url``, the
    token read from ``token_file`` and short timings (seconds instead of minutes/hours)."""
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    timings = timings or {"group_wait": "1s", "group_interval": "1s", "repeat_interval": "2s"}
    routes = [config["route"], *config["route"].get("routes", [])]
    for route in routes:
        route.update({k: v for k, v in timings.items() if k in route})
    for receiver in config["receivers"]:
        for webhook in receiver.get("webhook_configs", []):
            webhook["url"] = webhook_url
            webhook["http_config"]["authorization"]["credentials_file"] = str(token_file)
    return config


@pytest.fixture
def prometheus_server(tmp_path: Path) -> Iterator[Callable[..., Prometheus]]:
    """A factory of ``start_prometheus`` (in ``tmp_path``) that stops them all afterwards."""
    started: list[Prometheus] = []

    def start(**kwargs: Any) -> Prometheus:
        directory = kwargs.pop("directory", tmp_path / f"prometheus-{len(started)}")
        started.append(start_prometheus(directory, **kwargs))
        return started[-1]

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def alertmanager_server(tmp_path: Path) -> Iterator[Callable[..., Alertmanager]]:
    """A factory of ``start_alertmanager`` (in ``tmp_path``) that stops them all afterwards."""
    started: list[Alertmanager] = []

    def start(config: dict[str, Any]) -> Alertmanager:
        started.append(start_alertmanager(tmp_path / f"alertmanager-{len(started)}", config))
        return started[-1]

    yield start
    for server in started:
        server.stop()
