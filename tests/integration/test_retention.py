"""Retention against a real Redis: the registry there, and the embedding rows it removes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis

from control import retention
from control.registry import RedisRegistry, VersionState
from control.retention import RetentionError, collect_garbage
from services.embedding_cache.backing import RedisRows
from tests.conftest import redis_url
from tests.unit.control.fake_exports import PASS, leftovers, make_version, on_disk

pytestmark = pytest.mark.integration

NS = "gctest"


@pytest.fixture
def url() -> str:
    found = redis_url(db=14)
    if found is None:
        pytest.skip("no Redis answers (set CASCADE_TEST_REDIS_ADDRESS or start one)")
    redis.Redis.from_url(found).flushdb()
    return found


@pytest.fixture
def client(url: str) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(url)
    yield connection
    connection.close()


@pytest.fixture
def registry(url: str) -> Iterator[RedisRegistry]:
    opened = RedisRegistry(url, namespace=NS)
    yield opened
    opened.close()


def _materialize(url: str, version: int, rows: int = 40) -> None:
    """What `cascade materialize` writes for a version: two tables' rows, then the marker."""
    writer = RedisRows(url, NS)
    try:
        for table in ("user_id", "item_id"):
            writer.write_table(version, table, np.full((rows, 4), version, np.float32))
        writer.mark_complete(version, {"user_id": rows, "item_id": rows}, 4)
    finally:
        writer.close()


def _keys(client: redis.Redis, pattern: str) -> set[str]:
    return {k.decode() for k in client.scan_iter(match=pattern, count=1000)}


@pytest.fixture
def exported(tmp_path: Path, url: str, registry: RedisRegistry) -> Path:
    """Versions 1..4 on disk and in Redis; 4 production, 3 previous production."""
    for version in range(1, 5):
        make_version(tmp_path, version)
        _materialize(url, version)
        registry.register(version, PASS)
    registry.transition(3, VersionState.PRODUCTION, "deploy")
    registry.transition(4, VersionState.PRODUCTION, "promote")
    return tmp_path


def test_old_versions_lose_their_rows_and_serving_ones_keep_them(
    exported: Path, url: str, client: redis.Redis, registry: RedisRegistry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(retention, "UNLINK_BATCH", 7)  # several batches per version
    client.set(f"{NS}:emb:v11:user_id:0", b"x")  # v1's pattern must not reach v11
    client.set("other:emb:v1:user_id:0", b"x")  # nor another namespace
    assert len(_keys(client, f"{NS}:emb:v1:*")) == 81
    assert collect_garbage(registry, exported, 0, url, NS) == [1, 2]
    for version in (1, 2):
        assert _keys(client, f"{NS}:emb:v{version}:*") == set()
        assert not on_disk(exported, version) and registry.get(version) is None
    for version in (3, 4):
        assert len(_keys(client, f"{NS}:emb:v{version}:*")) == 81
        assert RedisRows(url, NS).stored_tables(version) is not None
        assert on_disk(exported, version)
    assert client.exists(f"{NS}:emb:v11:user_id:0", "other:emb:v1:user_id:0") == 2


def test_a_crash_after_the_rows_is_finished_by_a_rerun(
    exported: Path, url: str, client: redis.Redis, registry: RedisRegistry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    real = retention._remove_tree

    def crash(path: Path) -> None:
        raise RetentionError(f"crash removing {path}")

    monkeypatch.setattr(retention, "_remove_tree", crash)
    with pytest.raises(RetentionError):
        collect_garbage(registry, exported, 1, url, NS)
    # version 1: retired, its marker and rows gone first (it reads as "not in Redis"),
    # its first directory renamed; version 2 is kept (keep=1)
    assert registry.get(1).state is VersionState.RETIRED  # type: ignore[union-attr]
    assert _keys(client, f"{NS}:emb:v1:*") == set() and leftovers(exported)
    monkeypatch.setattr(retention, "_remove_tree", real)
    assert collect_garbage(registry, exported, 1, url, NS) == [1]
    assert not on_disk(exported, 1) and leftovers(exported) == []
    assert registry.get(1) is None and len(_keys(client, f"{NS}:emb:v2:*")) == 81


def test_a_dry_run_touches_no_key(
    exported: Path, url: str, client: redis.Redis, registry: RedisRegistry
) -> None:
    before = _keys(client, "*")
    assert collect_garbage(registry, exported, 0, url, NS, dry_run=True) == [1, 2]
    assert _keys(client, "*") == before


def test_an_unreachable_rows_redis_is_an_error_and_nothing_is_removed(
    exported: Path, registry: RedisRegistry
) -> None:
    with pytest.raises(RetentionError, match=r"version 1's embedding rows in redis://.*rerun"):
        collect_garbage(registry, exported, 0, "redis://127.0.0.1:1/0", NS)
    assert on_disk(exported, 1)
    assert registry.get(1).state is VersionState.RETIRED  # type: ignore[union-attr]
