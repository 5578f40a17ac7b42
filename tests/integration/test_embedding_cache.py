"""The hierarchical embedding cache against the real Redis: cached lookups equal direct table
lookups across evictions, version switches, async inserts and adversarial batches."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from services.embedding_cache.backing import RedisRows
from services.embedding_cache.cache import CacheConfig, HierarchicalEmbeddingCache
from services.embedding_cache.tier import CacheTier
from tests.conftest import redis_url

pytestmark = pytest.mark.integration
TABLES = {"user": 2_000, "genre": 20}
DIM = 8


@pytest.fixture
def backing() -> Iterator[RedisRows]:
    url = redis_url(db=11)
    if url is None:
        pytest.skip("no Redis answers on 127.0.0.1:6379 (.ci/run starts one)")
    rows = RedisRows(url, namespace="cache-test", timeout_s=1.0)
    rows.client.flushdb()
    yield rows
    rows.close()


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.normal(size=(n, DIM)).astype(np.float32) for name, n in TABLES.items()}


def _write(backing: RedisRows, version: int, weights: dict[str, np.ndarray]) -> None:
    for name, table in weights.items():
        backing.write_table(version, name, table)


def _expected(weights: dict[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
    out = np.zeros((len(ids), len(weights), DIM), np.float32)
    for j, table in enumerate(weights.values()):
        keys = ids[:, j]
        valid = (keys >= 0) & (keys < len(table))
        out[valid, j] = table[keys[valid]]
    return out


def _batch(rng: np.random.Generator, size: int) -> np.ndarray:
    hot = rng.zipf(1.2, size) % 2_400 - 200  # skewed, with ids below 0 and past the end
    return np.stack([hot, rng.integers(-3, 25, size)], axis=1)


@pytest.mark.parametrize("policy", ["lru", "lfu"])
@pytest.mark.parametrize("async_threshold", [1.0, 0.0])  # always sync / always async inserts
def test_cached_rows_equal_direct_lookups_across_evictions(
    backing: RedisRows, policy: str, async_threshold: float
) -> None:
    weights = _weights(0)
    _write(backing, 1, weights)
    cache = HierarchicalEmbeddingCache(
        backing,
        1,
        TABLES,
        DIM,
        CacheConfig(30, 120, policy, async_threshold),  # type: ignore[arg-type]
    )
    rng = np.random.default_rng(1)
    for _ in range(40):
        ids = _batch(rng, 500)
        np.testing.assert_array_equal(cache.lookup(ids), _expected(weights, ids))
    cache.flush()
    assert cache.device_tier.evictions > 0 and cache.host_tier.evictions > 0
    assert cache.device_tier.size <= 30 and cache.host_tier.size <= 120
    assert cache.stats["key_hits"] > 0 and cache.stats["fetched"] > 0
    cache.close()


def test_adversarial_batches(backing: RedisRows) -> None:
    weights = _weights(0)
    _write(backing, 1, weights)
    cache = HierarchicalEmbeddingCache(backing, 1, TABLES, DIM, CacheConfig(10, 20))
    same = np.tile([[7, 3]], (1000, 1))  # one key, a thousand times
    np.testing.assert_array_equal(cache.lookup(same), _expected(weights, same))
    unknown = np.array([[-1, -1], [10**9, 10**6], [1999, 19]])
    np.testing.assert_array_equal(cache.lookup(unknown), _expected(weights, unknown))
    assert cache.lookup(np.zeros((0, 2), np.int64)).shape == (0, 2, DIM)
    with pytest.raises(ValueError, match=r"shape \[N, 2\]"):
        cache.lookup(np.zeros((3, 5), np.int64))
    cache.close()


def test_rows_missing_from_the_store_are_default_rows(backing: RedisRows) -> None:
    weights = _weights(0)
    backing.write_table(1, "user", weights["user"][:100])  # the rest was never written
    backing.write_table(1, "genre", weights["genre"])
    cache = HierarchicalEmbeddingCache(backing, 1, TABLES, DIM, CacheConfig(10, 20))
    rows = cache.lookup(np.array([[5, 1], [500, 1]]))
    np.testing.assert_array_equal(rows[0, 0], weights["user"][5])
    assert not rows[1, 0].any() and not cache.degraded
    cache.close()


def test_a_version_switch_never_serves_old_rows(backing: RedisRows) -> None:
    old, new = _weights(0), _weights(1)
    _write(backing, 1, old)
    _write(backing, 2, new)
    cache = HierarchicalEmbeddingCache(backing, 1, TABLES, DIM, CacheConfig(500, 1000))
    ids = _batch(np.random.default_rng(2), 300)
    np.testing.assert_array_equal(cache.lookup(ids), _expected(old, ids))  # now cached
    cache.switch_version(2)
    np.testing.assert_array_equal(cache.lookup(ids), _expected(new, ids))
    cache.close()


def test_redis_down_serves_hits_and_defaults_and_flags_degraded(backing: RedisRows) -> None:
    weights = _weights(0)
    _write(backing, 1, weights)
    cache = HierarchicalEmbeddingCache(backing, 1, TABLES, DIM, CacheConfig(100, 200))
    warm = np.array([[1, 1], [2, 2]])
    cache.lookup(warm)
    cache.backing.close()
    cache.backing = RedisRows("redis://127.0.0.1:1/0", timeout_s=0.05)  # nothing listens there
    rows = cache.lookup(np.array([[1, 1], [3, 3]]))
    np.testing.assert_array_equal(rows[0], _expected(weights, warm)[0])  # hit still served
    assert not rows[1, 0].any() and cache.degraded  # miss -> default row, flagged
    cache.close()


def test_tier_rejects_bad_configuration() -> None:
    import torch

    with pytest.raises(ValueError, match="capacity"):
        CacheTier("device", 10, 4, 0, "lru", torch.device("cpu"))
    with pytest.raises(ValueError, match="not lru or lfu"):
        CacheTier("device", 10, 4, 5, "fifo", torch.device("cpu"))  # type: ignore[arg-type]


def test_ranker_scores_through_the_cache_equal_in_memory_tables(
    exported: Path, backing: RedisRows, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.inference.models import RankingModel
    from services.stores.materialize import materialize_embeddings

    assert materialize_embeddings(backing, exported / "model_repository", 1) > 0
    directory = exported / "model_repository" / "ranker" / "1"
    plain = RankingModel(directory)
    plain.load()
    monkeypatch.setenv("CASCADE_EMBEDDING_CACHE__REDIS_URL", backing.url)
    monkeypatch.setenv("CASCADE_EMBEDDING_CACHE__NAMESPACE", backing.namespace)
    cached = RankingModel(directory)
    cached.load()
    rng = np.random.default_rng(0)
    tables = plain.embeddings.tables  # type: ignore[union-attr]
    sparse = np.stack([rng.integers(0, len(t), 300) for t in tables], axis=1)
    sparse[:5] = -1  # out of range: the default row on both paths
    sparse[5:10] = 10**9
    dense = rng.normal(size=(300, 26)).astype(np.float32)
    for _ in range(3):  # cold, then warm
        scores, degraded = cached.score(sparse, dense)
        np.testing.assert_allclose(scores, plain.score(sparse, dense)[0], rtol=1e-6)
        assert not degraded
    cached.close()


def test_deferred_misses_get_default_rows_then_the_stored_rows(backing: RedisRows) -> None:
    weights = _weights(0)
    _write(backing, 1, weights)
    config = CacheConfig(500, 1000, async_threshold=0.0, miss_policy="defer")  # always defer
    cache = HierarchicalEmbeddingCache(backing, 1, TABLES, DIM, config)
    ids = _batch(np.random.default_rng(3), 400)
    first = cache.lookup(ids)
    assert not first.any() and not cache.degraded  # every row deferred: the default row
    stored = [
        np.unique(ids[(ids[:, j] >= 0) & (ids[:, j] < n), j]) for j, n in enumerate(TABLES.values())
    ]
    assert cache.stats["deferred"] == sum(len(keys) for keys in stored)
    cache.flush()  # the background fetch has landed
    np.testing.assert_array_equal(cache.lookup(ids), _expected(weights, ids))
    rng = np.random.default_rng(4)
    for _ in range(10):  # a deferred row is the default row, any other row is exact
        ids = _batch(rng, 300)
        got, want = cache.lookup(ids), _expected(weights, ids)
        exact = (got == want).all(axis=2)
        assert (exact | ~got.any(axis=2)).all()
    cache.close()


def test_deferred_work_of_an_old_version_is_never_served(backing: RedisRows) -> None:
    old, new = _weights(0), _weights(1)
    _write(backing, 1, old)
    _write(backing, 2, new)
    config = CacheConfig(500, 1000, async_threshold=0.0, miss_policy="defer")
    cache = HierarchicalEmbeddingCache(backing, 1, TABLES, DIM, config)
    ids = _batch(np.random.default_rng(5), 300)
    cache.lookup(ids)  # queues background fetches of version 1 ...
    cache.switch_version(2)  # ... that land after the switch
    cache.flush()
    for _ in range(2):
        got, want = cache.lookup(ids), _expected(new, ids)
        assert ((got == want).all(axis=2) | ~got.any(axis=2)).all()  # v2 rows or defaults
        cache.flush()
    np.testing.assert_array_equal(cache.lookup(ids), _expected(new, ids))
    cache.close()


def test_a_failed_deferred_fetch_flags_the_next_deferred_answer_degraded(
    backing: RedisRows,
) -> None:
    _write(backing, 1, _weights(0))
    config = CacheConfig(500, 1000, async_threshold=0.0, miss_policy="defer")
    cache = HierarchicalEmbeddingCache(backing, 1, TABLES, DIM, config)
    cache.backing.close()
    cache.backing = RedisRows("redis://127.0.0.1:1/0", timeout_s=0.05)  # nothing listens there
    cache.lookup(np.array([[1, 1]]))
    cache.flush()  # the background fetch failed
    assert not cache.lookup(np.array([[2, 2]])).any() and cache.degraded
    cache.flush()
    assert not cache.generation.in_flight.any()  # failed keys are asked for again later
    cache.close()


def test_the_serving_path_refuses_a_version_redis_does_not_hold(
    exported: Path, backing: RedisRows, caplog: pytest.LogCaptureFixture
) -> None:
    from core.errors import ArtifactError
    from services.inference.models import embeddings_for
    from services.settings import EmbeddingCacheSettings, RedisSettings, Settings

    directory = exported / "model_repository" / "ranker" / "1"
    settings = Settings(
        artifacts=exported,
        redis=RedisSettings(url=backing.url),
        embedding_cache=EmbeddingCacheSettings(namespace=backing.namespace, in_memory_max_mb=0),
    )
    with pytest.raises(ArtifactError, match="cascade materialize"):
        embeddings_for(directory, settings)
    down_url = "redis://cascade:s3cret-pw@127.0.0.1:1/0"
    down = settings.model_copy(update={"redis": RedisSettings(url=down_url)})
    with caplog.at_level("WARNING"):
        cache = embeddings_for(directory, down)  # Redis down at start: built, degraded
    assert "cannot check the embedding rows" in caplog.text
    assert "s3cret-pw" not in caplog.text  # the URL's password never reaches the log
    assert isinstance(cache, HierarchicalEmbeddingCache)
    cache.lookup(np.zeros((1, len(cache.names)), np.int64))
    assert cache.degraded
    cache.close()
    off = settings.model_copy(update={"embedding_cache": EmbeddingCacheSettings(enabled=False)})
    assert not isinstance(embeddings_for(directory, off), HierarchicalEmbeddingCache)


def test_tables_within_the_memory_budget_skip_the_cache(exported: Path, backing: RedisRows) -> None:
    from core.errors import ArtifactError
    from services.inference.embeddings import InMemoryTables, read_table_spec
    from services.inference.models import embeddings_for, tables_mib
    from services.settings import EmbeddingCacheSettings, RedisSettings, Settings

    directory = exported / "model_repository" / "ranker" / "1"
    size = tables_mib(read_table_spec(directory / "embeddings"))
    assert 0 < size < 1

    def chosen(budget_mib: float) -> object:
        settings = Settings(
            artifacts=exported,
            redis=RedisSettings(url=backing.url),
            embedding_cache=EmbeddingCacheSettings(
                namespace=backing.namespace, in_memory_max_mb=budget_mib
            ),
        )
        return embeddings_for(directory, settings)

    # this version's rows are not in Redis: within the budget that does not matter
    assert isinstance(chosen(size * 1.01), InMemoryTables)
    with pytest.raises(ArtifactError, match="cascade materialize"):
        chosen(size * 0.99)  # just over the budget: the cache, which needs Redis to hold them


def test_a_failing_redis_opens_the_cache_breaker_then_a_probe_closes_it(
    backing: RedisRows,
) -> None:
    import time

    from services.settings import BreakerSettings

    weights = _weights(0)
    _write(backing, 1, weights)
    config = CacheConfig(100, 200, breaker=BreakerSettings(failures=2, reset_s=0.3))
    cache = HierarchicalEmbeddingCache(backing, 1, TABLES, DIM, config)
    working = cache.backing
    dead = RedisRows("redis://127.0.0.1:1/0", timeout_s=0.05)  # nothing listens there
    reads: list[int] = []
    fetch_many = dead.fetch_many

    def counted(*args: object, **kwargs: object) -> object:
        reads.append(1)
        return fetch_many(*args, **kwargs)  # type: ignore[arg-type]

    dead.fetch_many = counted  # type: ignore[method-assign]
    cache.backing = dead
    for row in range(1, 6):  # two failed reads open it; the rest never touch Redis
        assert not cache.lookup(np.array([[row, 1]])).any() and cache.degraded
    assert len(reads) == 2 and cache.breaker.state == "open"
    assert cache.failure_reason == "circuit_open"
    cache.backing = working  # Redis is back: the half-open probe reads and closes it
    time.sleep(0.35)
    ids = np.array([[7, 2]])
    np.testing.assert_array_equal(cache.lookup(ids), _expected(weights, ids))
    assert not cache.degraded and cache.breaker.state == "closed"
    dead.close()
    cache.close()


def test_cache_config_maps_the_settings_field_by_field() -> None:
    from services.settings import BreakerSettings, EmbeddingCacheSettings

    settings = EmbeddingCacheSettings(
        policy="lfu", miss_policy="defer", breaker=BreakerSettings(failures=7, reset_s=3)
    )
    config = CacheConfig.from_settings(settings)
    assert (config.policy, config.miss_policy, config.breaker.failures) == ("lfu", "defer", 7)
