"""Run the real Triton Inference Server shipped inside the ``nvidia-pytriton`` wheel.

On a CPU-only machine, without Docker: the wheel carries the ``tritonserver`` binary and the
python backend; its python-backend stub must be copied next to the backend once, the stub
must find this virtualenv's ``python3`` first on PATH, and the interpreter's own
libpython through LD_LIBRARY_PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from pipelines.errors import CascadeError


class TritonUnavailable(CascadeError):
    """The server binary is not installed here, or it did not become ready."""


def wheel_directory() -> Path:
    """The ``pytriton/tritonserver`` directory of the installed wheel."""
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonUnavailable(
            "nvidia-pytriton is not installed: pip install --no-deps nvidia-pytriton==0.7.0"
        )
    directory = Path(next(iter(spec.submodule_search_locations))) / "tritonserver"
    if not (directory / "bin" / "tritonserver").is_file():
        raise TritonUnavailable(f"{directory}/bin/tritonserver is missing")
    return directory


def install_stub(directory: Path) -> None:
    """Copy the python-backend stub for this Python next to the backend (once)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    target = directory / "backends" / "python" / "triton_python_backend_stub"
    if target.is_file():
        return
    source = directory / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not source.is_file():
        raise TritonUnavailable(f"the wheel has no python backend stub for Python {version}")
    shutil.copy2(source, target)


class TritonServer:
    """A ``tritonserver`` child process in explicit model-control mode."""

    def __init__(
        self,
        model_repository: Path,
        models: Sequence[str] = ("query_tower", "ranker"),
        http_port: int = 8000,
        grpc_port: int = 8001,
        metrics_port: int = 8002,
        log_file: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.model_repository = model_repository
        self.env = env or {}  # on top of this process's environment (CASCADE_* for the models)
        self.models = list(models)
        self.http_port, self.grpc_port, self.metrics_port = http_port, grpc_port, metrics_port
        self.log_file = log_file
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def command(self, directory: Path) -> list[str]:
        return [
            str(directory / "bin" / "tritonserver"),
            f"--model-repository={self.model_repository.resolve()}",
            f"--backend-directory={directory / 'backends'}",
            "--pinned-memory-pool-byte-size=0",
            "--cuda-memory-pool-byte-size=0:0",
            "--allow-gpu-metrics=false",
            "--model-control-mode=explicit",
            *[f"--load-model={m}" for m in self.models],
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            "--exit-timeout-secs=10",
        ]

    def environment(self) -> dict[str, str]:
        env = {**os.environ, **self.env}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (libdir, env.get("LD_LIBRARY_PATH", "")) if p
        )
        return env

    def start(self, timeout_s: float = 60.0) -> None:
        directory = wheel_directory()
        install_stub(directory)
        output = self.log_file.open("ab") if self.log_file else subprocess.DEVNULL
        self.process = subprocess.Popen(
            self.command(directory),
            env=self.environment(),
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.wait_ready(timeout_s)

    def _get(self, path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}{path}", timeout=1) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return int(error.code)
        except OSError:
            return 0

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise TritonUnavailable(
                    f"tritonserver exited with code {self.process.returncode}"
                    + (f"; see {self.log_file}" if self.log_file else "")
                )
            if self._get("/v2/health/ready") == 200:
                return
            time.sleep(0.2)
        self.stop()
        raise TritonUnavailable(f"tritonserver not ready after {timeout_s:.0f} s")

    def load(self, model: str, config: dict | None = None) -> None:
        """(Re)load a model, optionally with an override configuration (explicit mode)."""
        body = json.dumps({"parameters": {"config": json.dumps(config)}} if config else {}).encode()
        request = urllib.request.Request(
            f"http://{self.http_url}/v2/repository/models/{model}/load",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            urllib.request.urlopen(request, timeout=60).close()
        except urllib.error.HTTPError as error:
            raise TritonUnavailable(
                f"loading {model} failed: {error.read().decode(errors='replace')}"
            ) from None

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
