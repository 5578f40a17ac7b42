"""The Triton server `cascade serve --triton` launches: loopback only, model control behind a
key, dies with its parent, refuses taken ports and foreign servers, restarts when killed under
a running gateway, a clean and bounded log, and the embedding cache's metrics on its port."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from threading import Thread

import httpx
import numpy as np
import pytest

from services.api.app import create_app
from services.embedding_cache.backing import RedisRows
from services.inference.triton import CONTROL_KEY_HEADER, TritonBackend
from services.inference.triton_server import TritonServer, TritonUnavailable, wheel_directory
from services.serving.gateway import Gateway
from services.settings import BreakerSettings, Settings, TritonSettings
from services.stores.materialize import materialize_embeddings
from services.util.child_process import listening_addresses, port_in_use
from services.util.local_redis import free_port
from tests.conftest import FEEDBACK_HEADERS, redis_url
from tests.integration.served_app import wait_until_ready

pytestmark = pytest.mark.integration
LOG_BOUND = 4096


def _server(repository: Path, log: Path, **options: object) -> TritonServer:
    try:
        wheel_directory()
    except TritonUnavailable as error:
        pytest.skip(f"Triton cannot run here: {error}")
    return TritonServer(
        repository,
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        log_file=log,
        **options,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def triton(exported: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """One server whose ranker reads through the embedding cache on the test Redis, with a
    small log bound."""
    url = redis_url(db=12)
    if url is None:
        pytest.skip("no Redis answers (set CASCADE_TEST_REDIS_ADDRESS)")
    rows = RedisRows(url, "cascade", timeout_s=5.0)
    materialize_embeddings(rows, exported / "model_repository", 1)
    rows.close()
    server = _server(
        exported / "model_repository",
        tmp_path_factory.mktemp("triton") / "triton.log",
        env={"CASCADE_REDIS__URL": url},
        log_max_bytes=LOG_BOUND,
        log_backups=2,
    )
    server.start(timeout_s=120)
    yield server
    server.stop()


def _post(server: TritonServer, path: str, body: dict, key: str | None = None) -> int:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers[CONTROL_KEY_HEADER] = key
    request = urllib.request.Request(
        f"http://{server.http_url}{path}",
        data=json.dumps(body).encode(),
        method="POST",
        headers=headers,
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def test_model_control_needs_the_key(triton: TritonServer) -> None:
    attack = {  # upload a model.py and have the server run it
        "parameters": {
            "config": json.dumps({"backend": "python", "max_batch_size": 0}),
            "file:1/model.py": base64.b64encode(b"import os; os._exit(3)").decode(),
        }
    }
    assert _post(triton, "/v2/repository/models/evil/load", attack) == 403
    assert _post(triton, "/v2/repository/models/evil/load", attack, key="wrong") == 403
    assert _post(triton, "/v2/repository/models/ranker/unload", {}) == 403
    assert _post(triton, "/v2/repository/index", {}) == 403
    assert _post(triton, "/v2/repository/index", {}, key=triton.control_key) == 200
    triton.load("query_tower")  # sends the key
    assert triton._get("/v2/models/ranker/ready") == 200  # the refused unload did nothing
    assert triton._get("/v2/models/evil/ready") != 200


@pytest.mark.parametrize("protocol", ["http", "grpc"])
async def test_the_backend_loads_and_unloads_with_the_key(
    triton: TritonServer, protocol: str
) -> None:
    from tritonclient.utils import InferenceServerException

    url = triton.http_url if protocol == "http" else f"127.0.0.1:{triton.grpc_port}"
    keyless = TritonBackend(url, protocol)
    await keyless.start([1])
    with pytest.raises(InferenceServerException, match="restricted"):
        await keyless.unload_model("query_tower")
    await keyless.close()
    backend = TritonBackend(url, protocol, control_key=triton.control_key)
    await backend.start([1])
    try:
        await backend.unload_model("query_tower")
        assert not await backend.ready("query_tower", 1)
        await backend.load_model("query_tower")
        assert await backend.ready("query_tower", 1)
    finally:
        await backend.close()


def test_every_port_is_bound_to_loopback_only(triton: TritonServer) -> None:
    assert triton.process is not None
    bound = listening_addresses(triton.process.pid)
    assert {port for _, port in bound} >= set(triton.ports.values())
    assert {address for address, _ in bound} == {"127.0.0.1"}


def test_a_default_wildcard_command_is_gone(triton: TritonServer, tmp_path: Path) -> None:
    command = triton.command(tmp_path)
    for name in ("http", "grpc", "metrics"):
        assert f"--{name}-address=127.0.0.1" in command


def test_requests_add_no_tracebacks_and_the_log_stays_bounded(triton: TritonServer) -> None:
    import asyncio

    async def requests() -> None:
        backend = TritonBackend(triton.http_url)
        await backend.start([1])
        rng = np.random.default_rng(0)
        for _ in range(20):
            scores, _ = await backend.rank(
                1, rng.integers(0, 50, (30, 10)), np.zeros((30, 26), np.float32)
            )
            assert scores.shape == (30, 1)
            await backend.encode_query(1, np.zeros((1, 5), np.int64), np.zeros((1, 20), np.int64))
        await backend.close()

    asyncio.run(requests())
    assert triton.log_file is not None
    files = sorted(triton.log_file.parent.glob(f"{triton.log_file.name}*"))
    text = "".join(f.read_text(errors="replace") for f in files)
    assert "Traceback" not in text and "PyCapsule" not in text
    assert len(files) == 3  # the start-up output alone crosses the bound: rotated
    assert all(f.stat().st_size <= LOG_BOUND for f in files)
    assert triton.control_key not in text


def test_the_embedding_cache_counts_on_the_metrics_port(triton: TritonServer) -> None:
    import asyncio

    async def requests() -> None:
        backend = TritonBackend(triton.http_url)
        await backend.start([1])
        rng = np.random.default_rng(1)
        for _ in range(3):
            await backend.rank(1, rng.integers(0, 50, (30, 10)), np.zeros((30, 26), np.float32))
        await backend.close()

    asyncio.run(requests())
    url = f"http://127.0.0.1:{triton.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    lookups = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("cascade_embedding_cache_lookups_total{")
    ]
    assert lookups and sum(lookups) > 0


def _ranker_as_exported(exported: Path, root: Path) -> Path:
    """The ranker's version 1 copied as exported, into ``root/model_repository``: the
    manifest's files alone (the module's own server may already have run the python stub on
    ``exported``, which writes beside them)."""
    from core.export.verify import manifest_files

    files = manifest_files(exported, 1)
    assert files is not None
    for name in [*files, "model_repository/ranker/config.pbtxt"]:
        if name.startswith("model_repository/ranker/"):
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(exported / name, root / name)
    return root / "model_repository"


def _ranker_server(
    repository: Path, log: Path
) -> tuple[TritonServer, TritonBackend, Callable[[str], int]]:
    """A started server of the ranker alone, a backend controlling it, and a count of a
    text's occurrences in the server's log."""
    server = _server(repository, log, models=("ranker",))
    server.start(timeout_s=120)
    backend = TritonBackend(
        server.http_url,
        control_key=server.control_key,
        model_repository=repository,
        models=("ranker",),
    )
    return server, backend, lambda text: log.read_text(errors="replace").count(text)


async def test_loading_a_served_version_again_keeps_its_instances(
    exported: Path, tmp_path: Path
) -> None:
    """A canary's load re-sends production's version: Triton must not create production's
    instances again. It does when the version directory changed since its first load (the
    python stub writing model.py's bytecode there), so the export ships the bytecode."""
    repository = _ranker_as_exported(exported, tmp_path)
    version = repository / "ranker" / "1"
    server, backend, count = _ranker_server(repository, tmp_path / "triton.log")
    try:
        await backend.start([1])
        shipped = {p: p.stat().st_mtime_ns for p in version.rglob("*")}
        created = count("TRITONBACKEND_ModelInstanceInitialize")
        assert created >= 1
        loads = count("successfully loaded 'ranker'")
        await backend.serve_versions([1])  # the override a canary's load sends
        deadline = time.monotonic() + 10
        while count("successfully loaded 'ranker'") == loads and time.monotonic() < deadline:
            time.sleep(0.1)
        assert count("successfully loaded 'ranker'") > loads
        assert count("TRITONBACKEND_ModelInstanceInitialize") == created
        assert {p: p.stat().st_mtime_ns for p in version.rglob("*")} == shipped
    finally:
        await backend.close()
        server.stop()


async def test_a_canary_that_fails_to_load_leaves_production_instances_alone(
    exported: Path, tmp_path: Path
) -> None:
    """A canary whose version cannot load (its model.py raises): the load is refused, and
    production's version keeps serving without Triton creating its instances again, through
    the failed load and through the rollback that re-sends production alone."""
    from tritonclient.utils import InferenceServerException

    repository = _ranker_as_exported(exported, tmp_path)
    server, backend, count = _ranker_server(repository, tmp_path / "triton.log")
    rng = np.random.default_rng(2)
    sparse, dense = rng.integers(0, 50, (30, 10)), np.zeros((30, 26), np.float32)
    try:
        await backend.start([1])
        before, _ = await backend.rank(1, sparse, dense)
        production_stubs = _stubs(server, 1)
        assert production_stubs
        broken = repository / "ranker" / "2"  # the canary's version arrives while serving
        shutil.copytree(repository / "ranker" / "1", broken)
        shutil.rmtree(broken / "__pycache__")  # model.py changes below: its bytecode is stale
        model = broken / "model.py"
        model.write_text(model.read_text() + "\nraise RuntimeError('canary broken on purpose')\n")
        with pytest.raises(InferenceServerException, match="canary broken on purpose"):
            await backend.serve_versions([1, 2])
        assert await backend.ready("ranker", 1)
        await backend.serve_versions([1])  # the rollback
        after, _ = await backend.rank(1, sparse, dense)
        np.testing.assert_array_equal(after, before)
        assert count("failed to load 'ranker' version 2") == 1
        # the broken version failed in its own stub's import; production's stubs are the
        # ones started at the start (its instances were never created again)
        assert _stubs(server, 1) == production_stubs
    finally:
        await backend.close()
        server.stop()


def test_a_taken_port_is_refused_naming_it(exported: Path, tmp_path: Path) -> None:
    server = _server(exported / "model_repository", tmp_path / "triton.log")
    with socket.socket() as orphan:
        orphan.bind(("0.0.0.0", server.grpc_port))  # e.g. an orphan on every interface
        orphan.listen()
        with pytest.raises(TritonUnavailable, match=rf"grpc port 127\.0\.0\.1:{server.grpc_port}"):
            server.start()
    assert server.process is None  # nothing was launched


def test_a_server_answering_on_our_port_that_we_did_not_launch_is_refused(
    exported: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Ready(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = _server(exported / "model_repository", tmp_path / "triton.log")
    foreign = HTTPServer(("127.0.0.1", server.http_port), Ready)
    Thread(target=foreign.serve_forever, daemon=True).start()
    monkeypatch.setattr(TritonServer, "check_ports", lambda self: None)  # lost the race
    try:
        with pytest.raises(TritonUnavailable, match="not the tritonserver this process launched"):
            server.start(timeout_s=120)
        assert server.process is not None and server.process.poll() is not None
    finally:
        foreign.shutdown()
        foreign.server_close()


def test_an_early_exit_is_an_error(exported: Path, tmp_path: Path) -> None:
    server = _server(tmp_path / "no-such-repository", tmp_path / "triton.log")
    with pytest.raises(TritonUnavailable, match="exited with code"):
        server.start(timeout_s=120)
    with pytest.raises(TritonUnavailable, match="already started"):
        TritonServer.start(_started(server))


def _started(server: TritonServer) -> TritonServer:
    server._supervisor = Thread(target=lambda: None)
    return server


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return found


def test_killing_cascade_serve_takes_its_triton_down(exported: Path, tmp_path: Path) -> None:
    try:
        wheel_directory()
    except TritonUnavailable as error:
        pytest.skip(f"Triton cannot run here: {error}")
    port = free_port()
    triton_port = _three_free_ports(avoid=port)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASCADE_")}
    output = tmp_path / "serve.log"
    with output.open("wb") as sink:
        serve = subprocess.Popen(
            [
                *(sys.executable, "-m", "cli.main", "serve", "--triton"),
                *("--artifacts", str(exported), "--port", str(port)),
                *("--triton-http-port", str(triton_port)),
            ],
            env={**env, "CASCADE_ARTIFACTS": str(exported)},
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until_ready(serve, f"http://127.0.0.1:{port}", output=output)
        (triton_pid,) = [p for p in _children(serve.pid) if "tritonserver" in _cmdline(p)]
        assert _alive(triton_pid)
        # the default placement runs the query tower in the gateway: Triton starts no stub for it
        assert "--load-model=ranker" in _cmdline(triton_pid)
        assert "--load-model=query_tower" not in _cmdline(triton_pid)
        serve.kill()
        serve.wait()
        deadline = time.monotonic() + 30
        while _alive(triton_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(triton_pid)
        assert not _taken(triton_port)
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()


def _three_free_ports(avoid: int) -> int:
    """A port whose next two are free as well (`cascade serve --triton-http-port P` gives
    Triton P, P + 1 and P + 2), none of them ``avoid``. Free as Triton's bind sees it: the
    local port of a live outgoing connection (a Redis client's, say) blocks a bind too,
    though nothing listens there."""
    while True:
        first = free_port()
        ports = (first, first + 1, first + 2)
        if avoid not in ports and not any(port_in_use("127.0.0.1", p) for p in ports):
            return first


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


def _taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


async def _client(settings: Settings) -> AsyncIterator[tuple[httpx.AsyncClient, Gateway]]:
    gateway = Gateway(settings)
    app = create_app(gateway=gateway)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://g", headers=FEEDBACK_HEADERS
        ) as http,
    ):
        yield http, gateway


async def test_a_triton_killed_under_the_gateway_is_restarted_and_reaped(
    exported: Path, tmp_path: Path
) -> None:
    import asyncio

    server = _server(exported / "model_repository", tmp_path / "triton.log", restart_backoff_s=0.2)
    server.start(timeout_s=120)
    settings = Settings(
        artifacts=exported,
        triton=TritonSettings(
            url=server.http_url, timeout_ms=3000, breaker=BreakerSettings(reset_s=0.5)
        ),
    )
    try:
        async for http, _ in _client(settings):
            assert not (await http.post("/v1/recommend", json={"user_id": 3})).json()["degraded"]
            assert server.process is not None
            old = server.process.pid
            stubs = [p for p in _group(old) if p != old]
            os.kill(old, signal.SIGKILL)
            body = (await http.post("/v1/recommend", json={"user_id": 3, "k": 10})).json()
            assert body["degraded"] and any(r.startswith("scoring:") for r in body["reasons"])
            deadline = time.monotonic() + 180
            while True:
                body = (await http.post("/v1/recommend", json={"user_id": 3})).json()
                if not body["degraded"]:
                    break
                assert time.monotonic() < deadline, body["reasons"]
                await asyncio.sleep(0.5)
            assert server.process.pid != old and server.restarts == 1
            assert not Path(f"/proc/{old}").exists()  # reaped, not a zombie
            assert not any(_alive(p) for p in stubs)  # its stubs went with it
    finally:
        server.stop()
    assert server.process is not None and server.process.poll() is not None


def _stubs(server: TritonServer, version: int) -> list[int]:
    """The python stubs serving the ranker's ``version`` under ``server``."""
    assert server.process is not None
    found = []
    for pid in _group(server.process.pid):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if f"/ranker/{version}/model.py".encode() in command:
            found.append(pid)
    return sorted(found)


def _group(pgid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:
                found.append(int(entry.name))
    return found
