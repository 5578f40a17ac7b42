"""Gateways follow the desired serving state without a restart (issue 10), on the embedded
stack (desired state in a file, models in process)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import REGISTRY

from pipelines.config import TrainConfig
from services.api.app import create_app
from services.serving.gateway import Gateway
from services.settings import FollowSettings, Settings
from services.state.desired_state import DesiredState, FileDesiredState
from tests.conftest import EXPORTED_TRAINING, FEEDBACK_HEADERS
from tests.integration.production_shape import export_twin

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def two_versions(exported: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The exported root with a second version (same models, exported again)."""
    root = tmp_path_factory.mktemp("two-versions") / "export"
    return export_twin(exported, root, TrainConfig(**EXPORTED_TRAINING))


@pytest.fixture
def root(two_versions: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "export"
    shutil.copytree(two_versions, copy)
    return copy


async def _client(root: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Gateway]]:
    settings = Settings(artifacts=root, follow=FollowSettings(retire_after_s=0))
    gateway = Gateway(settings)
    app = create_app(gateway=gateway)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://g", headers=FEEDBACK_HEADERS
        ) as http,
    ):
        yield http, gateway


async def _splits(gateway: Gateway) -> dict[str, set[str]]:
    """The ``split`` each logged answer names, by model version (what a rollout counts)."""
    assert gateway.impressions is not None
    await gateway.impressions.flush()
    logged: dict[str, set[str]] = {}
    for _, fields in await gateway.store.read_stream("impressions"):
        logged.setdefault(fields["model_version"], set()).add(fields["split"])
    return logged


async def _versions(http: httpx.AsyncClient, users: range) -> dict[int, int]:
    served = {}
    for user in users:
        body = (await http.post("/v1/recommend", json={"user_id": user, "k": 3})).json()
        served[user] = body["model_versions"]["release"]
    return served


def _store(root: Path) -> FileDesiredState:
    return FileDesiredState(root / "rollout" / "desired.json")


async def test_without_a_desired_state_the_newest_export_is_served(root: Path) -> None:
    async for http, _ in _client(root):
        assert set((await _versions(http, range(1, 20))).values()) == {2}


async def test_the_desired_state_at_start_wins_over_the_newest_export(root: Path) -> None:
    _store(root).write(DesiredState(production=1, revision=1), expected_revision=0)
    async for http, gateway in _client(root):
        assert sorted(gateway.releases) == [1]  # the newer export was never loaded
        assert set((await _versions(http, range(1, 20))).values()) == {1}


async def test_a_canary_is_loaded_routed_sticky_then_promoted_and_retired(root: Path) -> None:
    store = _store(root)
    state = store.write(DesiredState(production=1, revision=1), expected_revision=0)
    async for http, gateway in _client(root):
        assert gateway.follower is not None
        state = store.write(
            state.next(canary=2, canary_weight=0.5, step=1), expected_revision=state.revision
        )
        await gateway.follower.check()
        first = await _versions(http, range(1, 200))
        assert set(first.values()) == {1, 2}
        assert 40 < sum(v == 2 for v in first.values()) < 160  # about half the users
        assert await _versions(http, range(1, 200)) == first  # each user stays on one arm
        # every answer names the split that assigned it; one the client pinned names none
        assert await _splits(gateway) == {"1": {"2:0.5"}, "2": {"2:0.5"}}
        pinned = {"user_id": 5, "k": 3, "model_version": 2}
        assert (await http.post("/v1/recommend", json=pinned)).status_code == 200
        assert (await _splits(gateway))["2"] == {"2:0.5", ""}
        ready = (await http.get("/health/ready")).json()
        assert ready["rollout"]["routing"] == {"production": 1, "canary": 2, "canary_percent": 50.0}
        assert ready["rollout"]["applied_revision"] == 2
        metrics = (await http.get("/metrics")).text
        assert 'cascade_canary_weight{model_version="2"} 0.5' in metrics

        state = store.write(
            state.next(production=2, canary=None, canary_weight=0.0),
            expected_revision=state.revision,
        )
        await gateway.follower.check()
        assert set((await _versions(http, range(1, 50))).values()) == {2}
        assert sorted(gateway.releases) == [1, 2]  # the old production stays for rollback
        gateway.follower.keep_previous_s = 0
        await gateway.follower.check()
        assert sorted(gateway.releases) == [2]  # then it retires


async def test_a_canary_that_cannot_load_is_never_routed(root: Path) -> None:
    index = root / "releases" / "2" / "item_index.faiss"
    data = bytearray(index.read_bytes())
    data[-1] ^= 0xFF  # same size, one byte off: fails its sha256
    index.write_bytes(bytes(data))
    store = _store(root)
    state = store.write(DesiredState(production=1, revision=1), expected_revision=0)
    failures = REGISTRY.get_sample_value("cascade_version_load_failures_total", {"role": "canary"})
    async for http, gateway in _client(root):
        assert gateway.follower is not None
        store.write(state.next(canary=2, canary_weight=0.5), expected_revision=1)
        await gateway.follower.check()
        assert set((await _versions(http, range(1, 60))).values()) == {1}
        assert await _splits(gateway) == {"1": {""}}  # no canary split: none to count
        ready = (await http.get("/health/ready")).json()
        assert ready["rollout"]["routing"]["canary"] is None
        assert "release 2 cannot be loaded" in ready["rollout"]["problems"][0]
        assert "item_index.faiss" in ready["rollout"]["problems"][0]
        after = REGISTRY.get_sample_value("cascade_version_load_failures_total", {"role": "canary"})
        assert after == (failures or 0.0) + 1


async def test_an_unreadable_desired_state_keeps_the_last_known(root: Path) -> None:
    store = _store(root)
    store.write(DesiredState(production=1, revision=1), expected_revision=0)
    async for http, gateway in _client(root):
        assert gateway.follower is not None
        store.path.write_text("{not json")
        await gateway.follower.check()
        assert not gateway.follower.status()["reachable"]
        assert set((await _versions(http, range(1, 20))).values()) == {1}
