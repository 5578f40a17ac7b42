"""Run the real Triton Inference Server shipped inside the ``nvidia-pytriton`` wheel.

On a CPU-only machine, without Docker: the wheel carries the ``tritonserver`` binary and the
python backend; its python-backend stub must be copied next to the backend once, the stub
must find this virtualenv's ``python3`` first on PATH, and the interpreter's own
libpython through LD_LIBRARY_PATH.

The server this class launches listens on loopback unless told otherwise, keeps its
model-control API (and the other APIs that change the server) behind a key, dies with the
process that launched it, refuses to start on a taken port, is verified to be the process
answering its ports, is restarted (bounded, with backoff) when it dies under a running
gateway, and writes a size-rotated log.

A restart launches the server empty, so that the versions its gateway needs (production and
canary, loaded by the reconcile loop in one call) start their python stubs together instead
of one after the other; what nobody loaded within ``restart_load_grace_s`` it loads itself
(the repository's default, as at the first start).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from core.errors import CascadeError
from core.export.triton_gpu_configs import BLEND, ranker_parts
from services.inference.triton import CONTROL_KEY_HEADER
from services.util.child_process import (
    die_with_parent,
    listening_addresses,
    port_in_use,
)
from services.util.rotating_log import RotatingLog

log = logging.getLogger(__name__)

# APIs that change the server (load/unload/upload models, shared memory, trace and log
# settings): callable only with the control key. Health, metadata and inference stay open.
RESTRICTED_APIS = "model-repository,shared-memory,trace,logging"
STABLE_S = 60.0  # a server up this long resets the restart count
MAX_BACKOFF_S = 30.0


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


def backend_of(config: Path) -> str:
    """The backend a model's config.pbtxt names (``backend:``, or the one its ``platform:``
    runs on: ``onnxruntime_onnx`` -> onnxruntime), read with Triton's ModelConfig schema."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    parsed = text_format.Parse(config.read_text(), model_config_pb2.ModelConfig())
    return parsed.backend or parsed.platform.split("_")[0]


def check_backends(repository: Path, version: int, backends: Path) -> None:
    """Raise ``TritonUnavailable`` when ranker ``version`` calls models (a GPU-target
    export's ``triton_parts``) whose backend is not under ``backends``."""
    ranker = repository / "ranker" / str(version)
    parts = ranker_parts(ranker) if (ranker / BLEND).is_file() else {}
    for part in sorted(parts.values()):
        backend = backend_of(repository / part / "config.pbtxt")
        if not (backends / backend).is_dir():
            raise TritonUnavailable(
                f"ranker version {version} was exported for the GPU image (--triton-target "
                f"gpu): its {part} runs on Triton's {backend} backend, which this Triton "
                f"({backends}) lacks. Serve it in process (without --triton), on the GPU "
                "image (Dockerfile.triton-gpu), or export it again with --triton-target cpu"
            )


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
    """A supervised ``tritonserver`` child process in explicit model-control mode.

    ``start()`` launches it from a supervisor thread (the thread its parent-death signal is
    tied to) and waits until it is ready; the supervisor then waits on it and, when it dies
    without ``stop()``, kills what it left (python-backend stubs, shared memory) and starts
    it again, at most ``max_restarts`` times in a row with exponential backoff.
    """

    def __init__(
        self,
        model_repository: Path,
        models: Sequence[str] = ("query_tower", "ranker"),
        http_port: int = 8000,
        grpc_port: int = 8001,
        metrics_port: int = 8002,
        log_file: Path | None = None,
        env: dict[str, str] | None = None,
        address: str = "127.0.0.1",
        control_key: str | None = None,
        log_max_bytes: int = 10 << 20,
        log_backups: int = 3,
        max_restarts: int = 5,
        restart_backoff_s: float = 1.0,
        restart_load_grace_s: float = 5.0,
    ) -> None:
        self.model_repository = model_repository
        self.env = env or {}  # on top of this process's environment (CASCADE_* for the models)
        self.models = list(models)
        self.http_port, self.grpc_port, self.metrics_port = http_port, grpc_port, metrics_port
        self.address = address
        self.log_file = log_file
        self.log = RotatingLog(log_file, log_max_bytes, log_backups) if log_file else None
        self._control_key = control_key or secrets.token_urlsafe(32)
        self.max_restarts = max_restarts
        self.restart_backoff_s = restart_backoff_s
        self.restart_load_grace_s = restart_load_grace_s
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0  # restarts after an unexpected exit, over this object's life
        self._launches = 0
        self._launch_of: dict[int, int] = {}  # pid -> launch number (its shm prefix)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._loaded: dict[str, dict | None] = {}  # load() calls, replayed after a restart

    def __repr__(self) -> str:  # never shows the control key
        return f"TritonServer({self.model_repository}, {self.address}:{self.http_port})"

    @property
    def control_key(self) -> str:
        """The key the restricted APIs need (header ``triton-control-key``); never log it."""
        return self._control_key

    @property
    def host(self) -> str:
        """Where clients reach it: the bound address, loopback for a wildcard bind."""
        return "127.0.0.1" if self.address in ("0.0.0.0", "") else self.address

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def ports(self) -> dict[str, int]:
        return {"http": self.http_port, "grpc": self.grpc_port, "metrics": self.metrics_port}

    def shm_prefix(self, launch: int) -> str:
        """Name prefix of the python backend's shared-memory regions of one launch."""
        return f"cascade_triton_{os.getpid()}_{id(self):x}_{launch}_"

    def command(self, directory: Path, launch: int = 0, load_models: bool = True) -> list[str]:
        """The ``tritonserver`` command line; ``load_models=False``: start with no model."""
        restricted = f"{RESTRICTED_APIS}:{CONTROL_KEY_HEADER}={self._control_key}"
        return [
            str(directory / "bin" / "tritonserver"),
            f"--model-repository={self.model_repository.resolve()}",
            f"--backend-directory={directory / 'backends'}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix(launch)}",
            "--pinned-memory-pool-byte-size=0",
            "--cuda-memory-pool-byte-size=0:0",
            "--allow-gpu-metrics=false",
            "--model-control-mode=explicit",
            # every config is complete: no python-backend stub per load just to complete it
            "--disable-auto-complete-config",
            *[f"--load-model={m}" for m in (self.models if load_models else ())],
            f"--http-address={self.address}",
            f"--grpc-address={self.address}",
            f"--metrics-address={self.address}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            f"--http-restricted-api={restricted}",
            f"--grpc-restricted-protocol={restricted}",
            "--exit-timeout-secs=10",
        ]

    def environment(self) -> dict[str, str]:
        env = {**os.environ, **self.env}
        # the gateway workers' metric files are theirs: a python stub writing there would
        # add the embedding cache's counts to /metrics a second time (Triton exports them)
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (libdir, env.get("LD_LIBRARY_PATH", "")) if p
        )
        return env

    # -- start, supervise, stop ----------------------------------------------------------------

    def check_ports(self) -> None:
        """Raise ``TritonUnavailable`` naming the first port something already listens on."""
        for name, port in self.ports.items():
            if port_in_use(self.address, port):
                raise TritonUnavailable(
                    f"cannot start tritonserver: its {name} port {self.address}:{port} is "
                    "already in use (an orphaned tritonserver? find it with `ss -ltnp`)"
                )

    def start(self, timeout_s: float = 60.0) -> None:
        """Launch the server and return once it is ready and verified to be ours."""
        if self._supervisor is not None:
            raise TritonUnavailable("this TritonServer was already started")
        directory = wheel_directory()
        install_stub(directory)
        self.check_ports()
        self._stopping.clear()
        outcome: list[BaseException | None] = []
        started = threading.Event()
        self._supervisor = threading.Thread(
            target=self._supervise,
            args=(directory, timeout_s, outcome, started),
            daemon=True,
            name="tritonserver-supervisor",
        )
        self._supervisor.start()
        started.wait()
        if outcome[0] is not None:
            self._supervisor.join()
            self._supervisor = None
            raise outcome[0]

    def _supervise(
        self,
        directory: Path,
        timeout_s: float,
        outcome: list[BaseException | None],
        started: threading.Event,
    ) -> None:
        """The supervisor thread: launch, wait, clean up, restart (every launch forks here,
        so the parent-death signal fires when this thread ends)."""
        failures = 0
        while True:
            try:
                if outcome:  # a restart: the ports must be free again
                    self.check_ports()
                launched = self._launch(directory, timeout_s, load_models=not outcome)
                process, up_since = launched, time.monotonic()
            except BaseException as error:
                if not outcome:
                    outcome.append(error)
                    started.set()
                    return
                log.error("tritonserver restart failed: %s", error)
                process, up_since = None, time.monotonic()
            else:
                if not outcome:
                    outcome.append(None)
                    started.set()
                else:
                    self._after_restart(launched)
            if process is not None:
                code = self._wait_and_clean(process)
                if self._stopping.is_set():
                    return
                log.warning("tritonserver (pid %d) exited with code %s", process.pid, code)
                if time.monotonic() - up_since >= STABLE_S:
                    failures = 0
            if self._stopping.is_set():
                return
            if failures >= self.max_restarts:
                log.error(
                    "tritonserver: giving up after %d restarts in a row; scoring stays on "
                    "the fallback until `cascade serve` is restarted",
                    failures,
                )
                return
            delay = min(self.restart_backoff_s * 2**failures, MAX_BACKOFF_S)
            failures += 1
            self.restarts += 1
            log.warning(
                "restarting tritonserver in %.1f s (attempt %d of %d)",
                delay,
                failures,
                self.max_restarts,
            )
            if self._stopping.wait(delay):
                return

    def _launch(
        self, directory: Path, timeout_s: float, load_models: bool = True
    ) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._stopping.is_set():
                raise TritonUnavailable("stopped while starting")
            self._launches += 1
            read_end = None
            if self.log is not None:
                read_end, output = os.pipe()
            else:
                output = subprocess.DEVNULL
            try:
                process = subprocess.Popen(
                    self.command(directory, self._launches, load_models),
                    env=self.environment(),
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its stubs share its process group
                    preexec_fn=die_with_parent(signal.SIGTERM),
                )
            finally:
                if read_end is not None:
                    os.close(output)
            if read_end is not None and self.log is not None:
                self.log.pump(read_end)
            self._launch_of[process.pid] = self._launches
            self.process = process
        try:
            self.wait_ready(timeout_s, process)
        except BaseException:
            self._terminate(process)
            self._wait_and_clean(process)
            raise
        return process

    def _wait_and_clean(self, process: subprocess.Popen[bytes]) -> int:
        """Wait for ``process`` to exit, kill what it left in its process group (stubs) while
        its pid still holds the group, then reap it and remove its shared memory."""
        with contextlib.suppress(ChildProcessError):  # already reaped
            os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        code = process.wait()
        prefix = self.shm_prefix(self._launch_of.pop(process.pid, 0))
        for region in Path("/dev/shm").glob(f"{prefix}*"):
            region.unlink(missing_ok=True)
        return code

    def _get(self, path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}{path}", timeout=1) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return int(error.code)
        except OSError:
            return 0

    def wait_ready(self, timeout_s: float, process: subprocess.Popen[bytes] | None = None) -> None:
        """Wait until ``process`` answers ready on its own ports.

        Raises ``TritonUnavailable`` when it exits first, when the server answering is
        another process (an orphan holding the port), or after ``timeout_s``.
        """
        process = process or self.process
        assert process is not None, "start() first"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self._stopping.is_set():
            if process.poll() is not None:
                raise TritonUnavailable(
                    f"tritonserver exited with code {process.returncode}"
                    + (f"; see {self.log_file}" if self.log_file else "")
                )
            if self._get("/v2/health/ready") == 200:
                self.verify_owner(process)
                return
            time.sleep(0.2)
        if self._stopping.is_set():
            raise TritonUnavailable("stopped while starting")
        raise TritonUnavailable(f"tritonserver not ready after {timeout_s:.0f} s")

    def verify_owner(self, process: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
        """Raise ``TritonUnavailable`` unless ``process`` listens on all three ports within
        ``timeout_s`` (Triton opens its metrics port a moment after it answers ready; a port
        another process holds never becomes its own, and Triton exits when it cannot bind)."""
        pid = process.pid
        deadline = time.monotonic() + timeout_s
        while True:
            owned = {port for _, port in listening_addresses(pid)}
            missing = {name: port for name, port in self.ports.items() if port not in owned}
            if not missing:
                return
            if process.poll() is not None or time.monotonic() > deadline:
                name, port = next(iter(missing.items()))
                raise TritonUnavailable(
                    f"the server answering on {self.address}:{port} ({name}) is not the "
                    f"tritonserver this process launched (pid {pid})"
                )
            time.sleep(0.1)

    def _terminate(self, process: subprocess.Popen[bytes]) -> None:
        if process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 20 s) and its supervisor."""
        with self._lock:
            self._stopping.set()
            process = self.process
        if process is not None:
            self._terminate(process)
        if self._supervisor is not None and self._supervisor is not threading.current_thread():
            self._supervisor.join(timeout=30)
        self._supervisor = None
        if self.log is not None:
            self.log.close()

    # -- model control (the restricted API) ----------------------------------------------------

    def load(self, model: str, config: dict | None = None) -> None:
        """(Re)load a model, optionally with an override configuration (explicit mode);
        replayed after a restart."""
        self._post_load(model, config)
        self._loaded[model] = config

    def _post_load(self, model: str, config: dict | None) -> None:
        body = json.dumps({"parameters": {"config": json.dumps(config)}} if config else {}).encode()
        request = urllib.request.Request(
            f"http://{self.http_url}/v2/repository/models/{model}/load",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", CONTROL_KEY_HEADER: self._control_key},
        )
        try:
            urllib.request.urlopen(request, timeout=60).close()
        except urllib.error.HTTPError as error:
            raise TritonUnavailable(
                f"loading {model} failed: {error.read().decode(errors='replace')}"
            ) from None

    def _after_restart(self, process: subprocess.Popen[bytes]) -> None:
        """The server restarted empty: replay this object's ``load()`` calls, then give the
        gateway's reconcile loop ``restart_load_grace_s`` to load what it needs, and load the
        repository default of every model nobody has loaded or is loading by then."""
        self._replay_loads()
        if self._stopping.wait(self.restart_load_grace_s) or process.poll() is not None:
            return
        try:
            claimed = self.claimed_models()
        except (OSError, ValueError) as error:
            log.error("tritonserver restarted but its models cannot be listed: %s", error)
            return
        for model in self.models:
            if model in claimed:
                continue
            log.warning(
                "tritonserver restarted and nothing loaded %s within %.0f s: loading the "
                "repository's default",
                model,
                self.restart_load_grace_s,
            )
            try:
                self._post_load(model, None)
            except (TritonUnavailable, OSError) as error:
                log.error("loading %s after a restart failed: %s", model, error)

    def claimed_models(self) -> set[str]:
        """Models with a version READY or LOADING (from the repository index)."""
        request = urllib.request.Request(
            f"http://{self.http_url}/v2/repository/index",
            data=b"{}",
            method="POST",
            headers={"Content-Type": "application/json", CONTROL_KEY_HEADER: self._control_key},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            entries = json.loads(response.read())
        return {e["name"] for e in entries if e.get("state") in ("READY", "LOADING")}

    def _replay_loads(self) -> None:
        for model, config in self._loaded.items():
            try:
                self._post_load(model, config)
            except (TritonUnavailable, OSError) as error:
                log.error("reloading %s after a restart failed: %s", model, error)
