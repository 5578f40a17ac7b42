"""The reconcile loop (issue 35): a replica's inference server is brought back to the
versions the replica holds, convergence is checked on the server, readiness waits for it.
On a Triton double (the real Triton: tests/integration/test_fleet.py)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client import REGISTRY

from services.api.app import create_app
from services.inference.backends import QUERY_TOWER, RANKER, LocalBackend
from services.inference.placement import PlacedBackend
from services.inference.triton import TritonBackend
from services.serving.gateway import Gateway
from services.serving.routing import VersionRouter
from services.settings import FollowSettings, Settings
from services.state.desired_state import DesiredState, FileDesiredState
from services.state.follower import StateFollower
from services.state.reconcile import Reconciler, triton_of


class TritonDouble(TritonBackend):
    """What a Triton serves, in memory: ``restart()`` empties it and takes it down until
    ``up()``; versions in ``broken`` fail to load. Inference (when given a repository) by
    the real in-process models, refused while down."""

    def __init__(self, repository: Path | None = None) -> None:
        super().__init__("127.0.0.1:1", control_key="key", models=(RANKER,))
        self.served: set[int] = set()
        self.down = False
        self.broken: set[int] = set()
        self.loads = 0
        self.inner = LocalBackend(repository, models=(RANKER,)) if repository else None

    def restart(self, default: Iterable[int] = ()) -> None:
        self.down, self.served = True, set(default)

    def up(self) -> None:
        self.down = False

    async def start(self, versions: list[int]) -> None:  # Triton loads its own default
        if self.inner is not None:
            await self.inner.start(versions)

    async def close(self) -> None:
        if self.inner is not None:
            await self.inner.close()

    def _answer(self) -> None:
        if self.down:
            raise ConnectionRefusedError("connection refused")

    async def served_versions(self, versions: Iterable[int]) -> dict[str, set[int]]:
        self._answer()
        return {RANKER: set(self.served)}

    async def serve_versions(self, versions: list[int]) -> None:
        self._answer()
        self.loads += 1
        refused = set(versions) & self.broken
        self.served = (set(versions) - refused) | (self.served & refused)
        if self.inner is not None:
            await self.inner.serve_versions(sorted(set(versions) - refused))
        if refused:
            raise RuntimeError(f"version {sorted(refused)} failed to load")

    async def rank(
        self, version: int, sparse: np.ndarray, dense: np.ndarray
    ) -> tuple[np.ndarray, bool]:
        self._answer()
        if version not in self.served or self.inner is None:
            raise RuntimeError(f"ranker version {version} is not ready")
        return await self.inner.rank(version, sparse, dense)


def _actions(action: str) -> float:
    return REGISTRY.get_sample_value("cascade_reconcile_actions_total", {"action": action}) or 0.0


def _converged_gauge() -> float | None:
    return REGISTRY.get_sample_value("cascade_replica_converged")


def test_the_triton_client_is_found_behind_the_placement() -> None:
    triton = TritonDouble()
    local = LocalBackend(Path("unused"), models=(QUERY_TOWER,))
    assert triton_of(PlacedBackend(local, triton)) is triton
    assert triton_of(triton) is triton
    assert triton_of(LocalBackend(Path("unused"))) is None
    assert triton_of(None) is None


async def test_in_process_models_have_nothing_to_reconcile() -> None:
    reconciler = Reconciler(LocalBackend(Path("unused")))
    assert not reconciler.checks
    assert (await reconciler.reconcile([1, 2])).reachable
    assert reconciler.missing([1, 2]) == []


async def test_a_restarted_server_gets_the_versions_back_and_the_default_unloaded() -> None:
    triton = TritonDouble()
    reconciler = Reconciler(triton)
    assert reconciler.missing([1]) == ["inference server not checked yet"]
    triton.restart(default=[3])  # what its repository's version policy loads
    triton.up()
    loads, unloads = _actions("load"), _actions("unload")
    observed = await reconciler.reconcile([1, 2])
    assert triton.served == {1, 2} and observed.served == {RANKER: frozenset({1, 2})}
    assert (_actions("load") - loads, _actions("unload") - unloads) == (2, 1)
    assert reconciler.missing([1, 2]) == []
    await reconciler.reconcile([1, 2])  # already there: no call, nothing counted
    assert triton.loads == 1 and _actions("load") - loads == 2


async def test_a_down_server_is_reported_not_raised_and_a_refused_load_is_counted_as_missing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    triton = TritonDouble()
    reconciler = Reconciler(triton)
    triton.restart()
    observed = await reconciler.reconcile([1, 2])
    assert not observed.reachable
    assert reconciler.missing([1]) == [
        "inference server unreachable: ConnectionRefusedError: connection refused"
    ]
    triton.up()
    triton.broken = {2}
    loads = _actions("load")
    observed = await reconciler.reconcile([1, 2])
    assert reconciler.missing([1, 2]) == ["ranker version 2 not ready on the inference server"]
    assert _actions("load") - loads == 1  # only what it did load
    assert "reconciling the inference server to [1, 2] failed" in caplog.text


def _follower(tmp_path: Path, triton: TritonDouble) -> tuple[StateFollower, FileDesiredState]:
    """A follower of a gateway holding releases 1 and 2 (nothing to load from disk)."""

    async def warm_up(versions: list[int]) -> None:
        return None

    gateway: Any = SimpleNamespace(
        releases={1: object(), 2: object()},
        router=VersionRouter(1),
        backend=triton,
        warm_up=warm_up,
    )
    store = FileDesiredState(tmp_path / "rollout" / "desired.json")
    return StateFollower(gateway, store, interval_s=0.05, retire_after_s=600), store


async def test_a_revision_arriving_while_the_server_is_down_waits_instead_of_failing_the_canary(
    tmp_path: Path,
) -> None:
    triton = TritonDouble()
    follower, store = _follower(tmp_path, triton)
    store.write(DesiredState(production=1, revision=1), 0)
    await follower.check()
    assert follower.status()["converged"] is True and _converged_gauge() == 1
    store.write(DesiredState(production=1, canary=2, canary_weight=0.5, revision=2), 1)
    triton.restart()
    await follower.check()
    status = follower.status()
    assert follower.applied_revision == 1 and follower.canary_failed is None
    assert status["converged"] is False and _converged_gauge() == 0
    assert status["problems"] == [
        "revision 2 waits: inference server unreachable: ConnectionRefusedError: connection refused"
    ]
    assert follower.unserved()  # routed production 1 is not served either: not ready
    triton.up()
    await follower.check()
    status = follower.status()
    assert follower.applied_revision == 2 and status["converged"] is True, status["missing"]
    assert status["served"] == {RANKER: [1, 2]} and _converged_gauge() == 1
    report = {r["replica"]: r for r in store.reports()}[follower.replica]
    assert report["converged"] is True and report["missing"] == []


async def test_a_replica_routing_a_new_canary_stays_ready(tmp_path: Path) -> None:
    """Readiness judges the routed versions by the last observation of the server: one taken
    before the canary loaded would call the new router's canary unserved (a 503 until the
    tick's reconcile looked again)."""
    triton = TritonDouble()
    follower, store = _follower(tmp_path, triton)
    canary = follower.gateway.releases.pop(2)
    store.write(DesiredState(production=1, revision=1), 0)
    await follower.check()
    assert triton.served == {1}
    follower.gateway.releases[2] = canary  # as apply finds it on disk
    await follower.apply(DesiredState(production=1, canary=2, canary_weight=0.5, revision=2))
    assert follower.gateway.router.canary == 2 and triton.served == {1, 2}
    assert follower.unserved() == []


async def test_a_failed_canary_stays_in_the_history_after_the_rollback(tmp_path: Path) -> None:
    triton = TritonDouble()
    triton.broken = {2}
    follower, store = _follower(tmp_path, triton)
    store.write(DesiredState(production=1, canary=2, canary_weight=0.5, revision=1), 0)
    await follower.check()
    assert follower.canary_failed == 2
    store.write(DesiredState(production=1, revision=2), 1)  # the controller rolls back
    await follower.check()
    assert follower.canary_failed is None and follower.applied_revision == 2
    first, second = follower.history
    assert (first.revision, first.canary_failed, second.revision) == (1, 2, 2)
    assert "canary 2 cannot be loaded" in first.problems[0] and second.problems == ()


async def test_convergence_is_checked_on_the_server_not_assumed(tmp_path: Path) -> None:
    triton = TritonDouble()
    follower, store = _follower(tmp_path, triton)
    store.write(DesiredState(production=1, canary=2, canary_weight=0.5, revision=1), 0)
    await follower.check()
    assert follower.status()["converged"] is True
    triton.broken = {2}
    triton.restart(default=[1])
    await follower.check()  # still down: says what is missing, loads nothing
    report = {r["replica"]: r for r in store.reports()}[follower.replica]
    assert report["converged"] is False and report["applied_revision"] == 1
    assert report["missing"][0].startswith("inference server unreachable")
    triton.up()
    await follower.check()  # up, but the canary will not load: never reported converged
    assert follower.convergence() == ["ranker version 2 not ready on the inference server"]
    assert follower.unserved() == ["ranker version 2 not ready on the inference server"]
    triton.broken = set()
    await follower.check()
    assert follower.convergence() == [] and triton.served == {1, 2}


async def test_readiness_waits_for_the_server_while_answers_degrade(exported: Path) -> None:
    triton = TritonDouble(exported / "model_repository")
    settings = Settings(artifacts=exported, follow=FollowSettings(interval_s=0.05))
    async with _client(Gateway(settings, backend=_placed(exported, triton))) as http:
        await _until_ready(http, True)
        loads = _actions("load")
        triton.restart()
        body = await _until_ready(http, False)
        assert body["unserved"][0].startswith("inference server unreachable")
        answer = await http.post("/v1/recommend", json={"user_id": 3, "k": 5})
        assert answer.status_code == 200 and answer.json()["degraded"]
        assert answer.json()["reasons"] == ["scoring:error"]  # retrieval order, then popularity
        triton.up()  # back with nothing loaded: the loop loads the routed version
        await _until_ready(http, True)
        assert triton.served == {1} and _actions("load") - loads == 1
        answer = await http.post("/v1/recommend", json={"user_id": 3, "k": 5})
        assert not answer.json()["degraded"], answer.json()["reasons"]


async def test_readiness_can_ignore_the_server(exported: Path) -> None:
    triton = TritonDouble(exported / "model_repository")
    follow = FollowSettings(interval_s=0.05, ready_requires_served=False)
    settings = Settings(artifacts=exported, follow=follow)
    async with _client(Gateway(settings, backend=_placed(exported, triton))) as http:
        triton.restart()
        await asyncio.sleep(0.2)
        ready = await http.get("/health/ready")
        assert ready.status_code == 200 and ready.json()["unserved"] == []
        assert ready.json()["rollout"]["converged"] is False


def _placed(exported: Path, triton: TritonDouble) -> PlacedBackend:
    """The default placement: the query tower in the gateway, the ranker on the server."""
    return PlacedBackend(LocalBackend(exported / "model_repository", models=(QUERY_TOWER,)), triton)


@asynccontextmanager
async def _client(gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(gateway=gateway)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as http,
    ):
        yield http


async def _until_ready(http: Any, ready: bool, timeout_s: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        response = await http.get("/health/ready")
        if (response.status_code == 200) == ready:
            body: dict = response.json()
            assert body["ready"] is ready
            return body
        assert time.monotonic() < deadline, f"readiness stayed {response.json()}"
        await asyncio.sleep(0.05)


async def test_a_gateway_started_on_a_desired_state_exports_its_revision(tmp_path: Path) -> None:
    follower, store = _follower(tmp_path, TritonDouble())
    state = DesiredState(production=1, revision=0)
    for _ in range(7):  # revision 7
        state = store.write(state.next(), state.revision)
    follower.applied_revision = 7  # what Gateway.start sets when it starts on that state
    await follower.check()
    assert REGISTRY.get_sample_value("cascade_desired_state_revision") == 7
    assert follower.status()["converged"] is True


def test_a_gpu_target_rankers_parts_are_wanted_at_the_versions_that_call_them(
    tmp_path: Path,
) -> None:
    repository = tmp_path / "model_repository"
    parts = {"trees": "ranker_trees", "dense": "ranker_dense"}
    for version, blend in ((1, {"triton_parts": parts}), (2, {"triton_parts": {}}), (3, {})):
        (repository / RANKER / str(version)).mkdir(parents=True)
        (repository / RANKER / str(version) / "blend.json").write_text(json.dumps(blend))
    backend = TritonBackend("127.0.0.1:1", model_repository=repository, models=(RANKER,))
    wanted = backend.wanted([3, 2, 1, 4])  # 4: not exported yet (no blend.json)
    assert list(wanted) == ["ranker_trees", "ranker_dense", RANKER]  # parts load first
    assert wanted == {"ranker_trees": {1}, "ranker_dense": {1}, RANKER: {1, 2, 3, 4}}

    from services.state.reconcile import Observation

    callers = {m: frozenset(v) for m, v in wanted.items() if m != RANKER}
    served = {RANKER: frozenset({1, 2, 3}), "ranker_trees": frozenset({1})}
    observed = Observation({**served, "ranker_dense": frozenset()}, None, callers)
    assert observed.needed("ranker_trees", [2, 3]) == set()
    assert observed.missing([1, 2, 3]) == [
        "ranker_dense version 1 not ready on the inference server"
    ]
    assert observed.missing([2, 3]) == []  # CPU-target versions call no part
