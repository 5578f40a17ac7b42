"""Model placement: the query tower in the gateway, the ranker elsewhere; chosen by settings."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from services.inference.backends import QUERY_TOWER, RANKER, InferenceBackend, LocalBackend
from services.inference.placement import PlacedBackend
from services.inference.triton import TritonBackend
from services.serving.gateway import make_backend
from services.settings import Settings, TritonSettings


class RecordingRanker(InferenceBackend):
    """A ranker backend that records calls and can refuse versions."""

    def __init__(self, refuse: set[int] | None = None) -> None:
        self.calls: list[tuple] = []
        self.refuse = refuse or set()

    async def start(self, versions: list[int]) -> None:
        self.calls.append(("start", list(versions)))

    async def close(self) -> None:
        self.calls.append(("close",))

    async def serve_versions(self, versions: list[int]) -> None:
        if self.refuse & set(versions):
            raise RuntimeError(f"cannot load {sorted(self.refuse & set(versions))}")
        self.calls.append(("serve", list(versions)))

    async def encode_query(
        self, version: int, user_features: np.ndarray, history: np.ndarray
    ) -> np.ndarray:
        raise AssertionError("the query tower must not run on the ranker's backend")

    async def rank(
        self, version: int, sparse: np.ndarray, dense: np.ndarray
    ) -> tuple[np.ndarray, bool]:
        self.calls.append(("rank", version, len(sparse)))
        return np.zeros(len(sparse), np.float32), False


def _inputs(exported: Path) -> tuple[np.ndarray, np.ndarray]:
    """One request's query inputs, the history as long as the release's (the ONNX input's)."""
    manifest = json.loads((exported / "releases/1/manifest.json").read_text())
    length = int(manifest["config"]["history_length"])
    return np.zeros((1, 5), np.int64), np.arange(length, dtype=np.int64).reshape(1, length) % 7


async def test_the_query_tower_runs_in_process_and_the_ranker_on_the_other_backend(
    exported: Path,
) -> None:
    repository = exported / "model_repository"
    ranker = RecordingRanker()
    placed = PlacedBackend(LocalBackend(repository, models=(QUERY_TOWER,)), ranker)
    everything = LocalBackend(repository)
    await placed.start([1])
    await everything.start([1])
    try:
        assert placed.query.ranker == {}  # no ranker (nor its embedding tables) in process
        features, history = _inputs(exported)
        np.testing.assert_array_equal(
            await placed.encode_query(1, features, history),
            await everything.encode_query(1, features, history),
        )
        scores, degraded = await placed.rank(1, np.zeros((3, 10), np.int64), np.zeros((3, 26)))
        assert len(scores) == 3 and not degraded
        assert ranker.calls == [("start", [1]), ("rank", 1, 3)]
    finally:
        await placed.close()
        await everything.close()
    assert ranker.calls[-1] == ("close",) and placed.query.versions == set()


async def test_a_version_the_ranker_refuses_changes_nothing_in_process(exported: Path) -> None:
    placed = PlacedBackend(
        LocalBackend(exported / "model_repository", models=(QUERY_TOWER,)),
        RecordingRanker(refuse={2}),
    )
    await placed.start([1])
    try:
        with pytest.raises(RuntimeError, match=r"cannot load \[2\]"):
            await placed.serve_versions([1, 2])
        assert placed.query.versions == {1}
        await placed.serve_versions([1])
        assert placed.query.versions == {1}
        await placed.serve_versions([])
        assert placed.query.versions == set() and placed.query.query == {}
    finally:
        await placed.close()


def test_an_unknown_model_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown models \\['dlrm'\\]"):
        LocalBackend(tmp_path, models=("dlrm",))


def test_settings_choose_the_placement(tmp_path: Path) -> None:
    url = "127.0.0.1:8001"
    default = make_backend(Settings(artifacts=tmp_path, triton=TritonSettings(url=url)))
    assert isinstance(default, PlacedBackend) and isinstance(default.ranker, TritonBackend)
    assert default.query.models == (QUERY_TOWER,)
    assert default.ranker.models == (RANKER,)  # Triton loads no query-tower versions
    remote = make_backend(
        Settings(artifacts=tmp_path, triton=TritonSettings(url=url, query_tower="triton"))
    )
    assert isinstance(remote, TritonBackend) and remote.models == (QUERY_TOWER, RANKER)
    assert isinstance(make_backend(Settings(artifacts=tmp_path)), LocalBackend)


def test_an_unknown_placement_is_a_settings_error_naming_the_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CASCADE_TRITON__QUERY_TOWER", "gpu")
    with pytest.raises(ValueError, match=r"triton\.query_tower"):
        Settings()


class RecordingTritonClient:
    def __init__(self) -> None:
        self.loaded: list[str] = []

    async def load_model(self, model: str, headers: dict, config: str | None) -> None:
        self.loaded.append(model)

    async def is_model_ready(self, model: str, version: str) -> bool:
        return True


async def test_a_triton_backend_changes_versions_of_its_own_models_only(exported: Path) -> None:
    backend = TritonBackend(
        "127.0.0.1:1", models=(RANKER,), model_repository=exported / "model_repository"
    )
    client = RecordingTritonClient()
    backend._client = client
    await backend.serve_versions([1])
    assert client.loaded == [RANKER]
