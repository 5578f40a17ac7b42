"""Corrupted artifacts (same size, so only the manifest's sha256 can tell): every loader
refuses them naming the file, and the gateway keeps serving the newest version that verifies."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from core.errors import ArtifactError
from services.inference.models import QueryTowerModel, RankingModel
from services.serving.gateway import Gateway
from services.serving.release import load_release
from services.settings import Settings
from services.stores.materialize import materialize, materialize_embeddings
from services.stores.memory import InMemoryStore


@pytest.fixture
def root(exported: Path, tmp_path: Path) -> Path:
    """A private copy of the test export (version 1), safe to corrupt."""
    copy = tmp_path / "artifacts"
    for part in ("releases", "model_repository"):
        shutil.copytree(exported / part, copy / part)
    return copy


def _add_version(root: Path, source: int = 1, target: int = 2) -> None:
    """A second, intact version: a copy of ``source`` with its manifest re-keyed."""
    shutil.copytree(root / "releases" / str(source), root / "releases" / str(target))
    for model in ("query_tower", "ranker"):
        directory = root / "model_repository" / model
        shutil.copytree(directory / str(source), directory / str(target))
    path = root / "releases" / str(target) / "manifest.json"
    manifest = json.loads(path.read_text())
    renamed = {}
    for name, digest in manifest["files"].items():
        parts = name.split("/")
        index = 1 if parts[0] == "releases" else 2
        parts[index] = str(target)
        renamed["/".join(parts)] = digest
    manifest.update(version=target, files=renamed, models=dict.fromkeys(manifest["models"], target))
    path.write_text(json.dumps(manifest))


def _flip_byte(path: Path, offset: int = -1) -> None:
    """Corrupt one byte in place; the size stays the same."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def _assert_names(error: pytest.ExceptionInfo[ArtifactError], root: Path, name: str) -> None:
    """The message names the file and says expected vs actual sha256, shortened."""
    message = str(error.value)
    assert name in message
    version = name.split("/")[1] if name.startswith("releases") else name.split("/")[2]
    expected = json.loads((root / "releases" / version / "manifest.json").read_text())["files"]
    assert expected[name][:12] in message
    assert hashlib.sha256((root / name).read_bytes()).hexdigest()[:12] in message
    assert expected[name] not in message  # shortened, not the whole digest


def test_same_size_corrupted_index_is_refused_naming_the_file(root: Path) -> None:
    index = root / "releases/1/item_index.faiss"
    size = index.stat().st_size
    _flip_byte(index)  # a byte of the last item vector: faiss still reads the file
    assert index.stat().st_size == size
    with pytest.raises(ArtifactError, match="sha256") as error:
        load_release(root)
    _assert_names(error, root, "releases/1/item_index.faiss")


def test_permuted_item_ids_are_refused(root: Path) -> None:
    path = root / "releases/1/item_ids.npy"
    ids = np.load(path)
    np.save(path, ids[np.random.default_rng(0).permutation(len(ids))])
    with pytest.raises(ArtifactError, match="sha256") as error:
        load_release(root)
    _assert_names(error, root, "releases/1/item_ids.npy")


def test_a_listed_file_that_is_missing_is_refused_naming_it(root: Path) -> None:
    (root / "releases/1/popularity.json").unlink()
    with pytest.raises(ArtifactError, match=r"releases/1/popularity\.json.*missing"):
        load_release(root)


def test_ranker_refuses_a_corrupted_embedding_table(root: Path) -> None:
    directory = root / "model_repository/ranker/1"
    column = json.loads((directory / "embeddings/tables.json").read_text())["columns"][0]
    _flip_byte(directory / "embeddings" / f"{column}.npy")
    with pytest.raises(ArtifactError, match="sha256") as error:
        RankingModel(directory, settings=Settings(artifacts=root)).load()
    _assert_names(error, root, f"model_repository/ranker/1/embeddings/{column}.npy")


def test_ranker_refuses_a_corrupted_dense_part(root: Path) -> None:
    path = root / "model_repository/ranker/1/dlrm_dense.onnx"
    _flip_byte(path, offset=path.stat().st_size // 2)  # inside the weights
    with pytest.raises(ArtifactError, match="sha256") as error:
        RankingModel(path.parent, settings=Settings(artifacts=root)).load()
    _assert_names(error, root, "model_repository/ranker/1/dlrm_dense.onnx")


def test_query_tower_refuses_a_corrupted_model(root: Path) -> None:
    path = root / "model_repository/query_tower/1/model.onnx"
    _flip_byte(path, offset=path.stat().st_size // 2)
    with pytest.raises(ArtifactError, match="sha256") as error:
        QueryTowerModel(path.parent).load()
    _assert_names(error, root, "model_repository/query_tower/1/model.onnx")


@pytest.mark.parametrize(
    "corrupted", ["releases/2/item_index.faiss", "model_repository/ranker/2/dlrm_dense.onnx"]
)
async def test_gateway_serves_the_older_verified_version_and_says_so(
    root: Path, corrupted: str, caplog: pytest.LogCaptureFixture
) -> None:
    _add_version(root)
    _flip_byte(root / corrupted, offset=(root / corrupted).stat().st_size // 2)
    gateway = Gateway(Settings(artifacts=root), store=InMemoryStore())
    with caplog.at_level(logging.WARNING, logger="services"):
        await gateway.start()
    try:
        assert sorted(gateway.releases) == [1]
        assert gateway.router is not None and gateway.router.default == 1
        ctx, release = await gateway.recommend(3, 5, {}, [], None)
        assert release.version == 1 and len(ctx.candidates) == 5 and not ctx.degraded
        [problem] = gateway.release_problems
        assert corrupted in problem and "release 2" in problem and "release 1" in problem
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert any("release 2" in m and "release 1" in m for m in warnings)
    finally:
        await gateway.close()


async def test_intact_versions_have_no_release_problems(root: Path) -> None:
    _add_version(root)
    gateway = Gateway(Settings(artifacts=root), store=InMemoryStore())
    await gateway.start()
    try:
        assert sorted(gateway.releases) == [2] and gateway.release_problems == []
    finally:
        await gateway.close()


async def test_gateway_without_fallback_refuses_to_start(root: Path) -> None:
    _add_version(root)
    _flip_byte(root / "releases/2/item_ids.npy")
    gateway = Gateway(Settings(artifacts=root, artifact_fallback=False), store=InMemoryStore())
    with pytest.raises(ArtifactError, match=r"releases/2/item_ids\.npy"):
        await gateway.start()


async def test_a_pinned_corrupted_version_refuses_to_start(root: Path) -> None:
    _add_version(root)
    _flip_byte(root / "releases/1/item_index.faiss")  # the pinned one; 2 is intact
    gateway = Gateway(Settings(artifacts=root, model_version=1), store=InMemoryStore())
    with pytest.raises(ArtifactError, match=r"releases/1/item_index\.faiss") as error:
        await gateway.start()
    assert "CASCADE_MODEL_VERSION" in str(error.value)
    assert not gateway.ready


async def test_a_corrupted_canary_is_dropped_and_said(root: Path) -> None:
    _add_version(root)
    tower = root / "model_repository/query_tower/2/model.onnx"
    _flip_byte(tower, offset=tower.stat().st_size // 2)  # a weight: onnxruntime still loads it
    settings = Settings(artifacts=root, model_version=1, canary_version=2, canary_percent=50)
    gateway = Gateway(settings, store=InMemoryStore())
    await gateway.start()
    try:
        assert sorted(gateway.releases) == [1]
        assert gateway.router is not None and gateway.router.canary is None
        assert all(gateway.router.route(user) == 1 for user in range(50))
        [problem] = gateway.release_problems
        assert "canary" in problem and "model_repository/query_tower/2/model.onnx" in problem
    finally:
        await gateway.close()


async def test_materialize_refuses_a_corrupted_release_writing_nothing(root: Path) -> None:
    tables = root / "model_repository/ranker/1/embeddings/tables.json"
    column = json.loads(tables.read_text())["columns"][-1]
    name = f"model_repository/ranker/1/embeddings/{column}.npy"
    _flip_byte(root / name)
    store = InMemoryStore()
    await store.start()
    with pytest.raises(ArtifactError, match="sha256") as error:
        await materialize(store, root / "releases" / "1")
    _assert_names(error, root, name)
    assert store.users == {}  # no user was written


class _RecordingRows:
    """Stands in for RedisRows: records what would have been written."""

    def __init__(self) -> None:
        self.written: list[str] = []

    def write_table(self, version: int, column: str, table: np.ndarray) -> int:
        self.written.append(column)
        return len(table)

    def mark_complete(self, version: int, rows: dict[str, int], dim: int) -> None:
        self.written.append("complete")


def test_materialize_embeddings_refuses_a_corrupted_table_writing_nothing(root: Path) -> None:
    directory = root / "model_repository/ranker/1/embeddings"
    column = json.loads((directory / "tables.json").read_text())["columns"][-1]
    _flip_byte(directory / f"{column}.npy")
    rows = _RecordingRows()
    with pytest.raises(ArtifactError, match=f"embeddings/{column}.npy"):
        materialize_embeddings(rows, root / "model_repository", 1)  # type: ignore[arg-type]
    assert rows.written == []


async def test_when_no_version_verifies_start_fails_naming_the_newest_problem(root: Path) -> None:
    _flip_byte(root / "releases/1/item_index.faiss")
    gateway = Gateway(Settings(artifacts=root), store=InMemoryStore())
    with pytest.raises(ArtifactError, match=r"no release .* verifies.*releases/1/item_index"):
        await gateway.start()


async def test_a_corrupted_canary_without_fallback_refuses_to_start(root: Path) -> None:
    _add_version(root)
    _flip_byte(root / "releases/2/popularity.json")
    settings = Settings(
        artifacts=root,
        model_version=1,
        canary_version=2,
        canary_percent=50,
        artifact_fallback=False,
    )
    with pytest.raises(ArtifactError, match=r"releases/2/popularity\.json"):
        await Gateway(settings, store=InMemoryStore()).start()
