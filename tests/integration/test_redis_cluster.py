"""Redis by role (issue 35): the rebuildable data (features, embedding rows) on a real 3-node
Redis Cluster reads the same as on one Redis, spread over the nodes; the durable data
(feedback stream, registry, desired state, retrain queue) goes to the durable Redis."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import redis
from pydantic import SecretStr

from cli.main import main
from control.registry import make_registry
from services.embedding_cache.backing import RedisRows
from services.embedding_cache.cache import HierarchicalEmbeddingCache
from services.embedding_cache.cluster import key_slot, table_slots
from services.inference.embeddings import read_table_spec
from services.inference.models import RankingModel
from services.settings import FeedbackSettings, RedisSettings, Settings
from services.state.retrain_queue import make_retrain_queue
from services.stores.monitor import StoreMonitor
from services.stores.redis import RedisStore
from services.util.local_redis import start_redis_server
from services.util.local_redis_cluster import LocalCluster
from tests.conftest import TEST_FEEDBACK_KEY, app_client
from tests.integration.redis_cluster import flush, keys_per_node, redis_cluster

pytestmark = pytest.mark.integration
__all__ = ["redis_cluster"]  # the session fixture, imported for pytest

NAMESPACE = "cascade"


@pytest.fixture
def cluster(redis_cluster: LocalCluster) -> LocalCluster:
    flush(redis_cluster)
    return redis_cluster


def _materialize(exported: Path, url: str, durable: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASCADE_REDIS__URL", url)
    monkeypatch.setenv("CASCADE_REDIS__DURABLE_URL", durable)
    assert main(["materialize", "--artifacts", str(exported), "--redis-url", url]) == 0


def _reshard(cluster: LocalCluster, slots: int) -> None:
    """Move ``slots`` slots, keys included, from the first node to the second."""
    cli = shutil.which("redis-cli")
    assert cli is not None
    ids = [
        subprocess.run([cli, "-p", str(p), "CLUSTER", "MYID"], capture_output=True, check=True)
        .stdout.decode()
        .strip()
        for p in cluster.ports[:2]
    ]
    subprocess.run(
        [
            *(cli, "--cluster", "reshard", f"127.0.0.1:{cluster.ports[0]}"),
            *("--cluster-from", ids[0], "--cluster-to", ids[1]),
            *("--cluster-slots", str(slots), "--cluster-yes"),
        ],
        capture_output=True,
        check=True,
        timeout=60,
    )


def test_embedding_rows_on_the_cluster_equal_one_redis(
    exported: Path,
    cluster: LocalCluster,
    private_redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _materialize(exported, cluster.url, private_redis_url, monkeypatch)
    _materialize(exported, private_redis_url, private_redis_url, monkeypatch)
    directory = exported / "model_repository" / "ranker" / "1"
    spec = read_table_spec(directory / "embeddings")
    on_cluster, on_one = RedisRows(cluster.url, timeout_s=5.0), RedisRows(private_redis_url)
    wanted = [(name, np.arange(rows + 3)) for name, rows in spec.rows.items()]  # + 3 absent
    try:
        assert on_cluster.stored_tables(1) == on_one.stored_tables(1) is not None
        for (rows, found), (expected, expected_found) in zip(
            on_cluster.fetch_many(1, wanted, spec.dim),
            on_one.fetch_many(1, wanted, spec.dim),
            strict=True,
        ):
            np.testing.assert_array_equal(found, expected_found)
            assert found[:-3].all() and not found[-3:].any()
            np.testing.assert_array_equal(rows, expected)
        # each table's rows are spread over every node (a table is not one slot)
        for name in spec.rows:
            assert min(keys_per_node(cluster, f"{NAMESPACE}:emb:v1:{name}:*")) > 0

        # a resharded slot answers MOVED: the reader reads the slot map again, same rows
        _reshard(cluster, 2_000)
        again = on_cluster.fetch_many(1, wanted, spec.dim)
        for (rows, _), (expected, _) in zip(
            again, on_one.fetch_many(1, wanted, spec.dim), strict=True
        ):
            np.testing.assert_array_equal(rows, expected)
    finally:
        on_cluster.close()
        on_one.close()

    # the ranker through the cache on the cluster scores as with the tables in memory
    plain = RankingModel(directory)
    plain.load()
    monkeypatch.setenv("CASCADE_REDIS__URL", cluster.url)
    monkeypatch.setenv("CASCADE_EMBEDDING_CACHE__IN_MEMORY_MAX_MB", "0")
    cached = RankingModel(directory)
    cached.load()
    assert isinstance(cached.embeddings, HierarchicalEmbeddingCache)
    rng = np.random.default_rng(0)
    sparse = np.stack([rng.integers(-2, n + 2, 200) for n in spec.rows.values()], axis=1)
    dense = rng.normal(size=(200, 26)).astype(np.float32)
    for _ in range(2):  # cold (every row from the cluster), then warm
        scores, degraded = cached.score(sparse, dense)
        np.testing.assert_allclose(scores, plain.score(sparse, dense)[0], rtol=1e-6)
        assert not degraded
    cached.close()


async def test_features_on_the_cluster_equal_one_redis(
    exported: Path,
    cluster: LocalCluster,
    private_redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await asyncio.to_thread(_materialize, exported, cluster.url, private_redis_url, monkeypatch)
    users = pd.read_parquet(exported / "releases" / "1" / "online" / "users.parquet")["user_id"]
    single = RedisStore(f"{private_redis_url[:-2]}/3")  # another db: the features of one Redis
    on_cluster = RedisStore(cluster.url, NAMESPACE, durable_url=private_redis_url)
    await single.start()
    await on_cluster.start()
    try:
        from services.stores.materialize import materialize

        await materialize(single, exported / "releases" / "1")
        for user_id in [*users.tolist(), 10**9]:  # every user, and one that is not there
            got, expected = await on_cluster.lookup(user_id), await single.lookup(user_id)
            assert got.loaded and expected.loaded
            assert (got.user is None) == (expected.user is None)
            if got.user is not None and expected.user is not None:
                assert got.user.attributes == expected.user.attributes
                np.testing.assert_array_equal(got.user.recent, expected.user.recent)
                np.testing.assert_array_equal(got.user.seen, expected.user.seen)
        assert min(keys_per_node(cluster, f"{NAMESPACE}:s*:user:*")) > 0

        # the cluster is rebuildable: emptied, the gateways' monitor reloads its users
        # (under the reload lock, which lives in the durable Redis)
        flush(cluster)
        assert not (await on_cluster.lookup(int(users.iloc[0]))).loaded
        monitor = StoreMonitor(on_cluster, exported / "releases" / "1", auto_materialize=True)
        assert await monitor.check() == "ok"
        reloaded = await on_cluster.lookup(int(users.iloc[0]))
        assert reloaded.loaded and reloaded.user is not None
        assert sum(keys_per_node(cluster, f"{NAMESPACE}:s*:user:*")) == len(users)
    finally:
        await single.close()
        await on_cluster.close()


async def test_durable_data_goes_to_the_durable_redis(
    exported: Path, cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # with AOF: feedback's durability check (required by default) must read the durable
    # Redis, not the cluster's nodes, which persist nothing
    durable_url, server = start_redis_server(tmp_path, persist=True)
    durable = redis.Redis.from_url(durable_url)
    try:
        await asyncio.to_thread(_materialize, exported, cluster.url, durable_url, monkeypatch)
        on_cluster = keys_per_node(cluster)
        assert durable.dbsize() == 0  # materialize writes only rebuildable data
        settings = Settings(
            artifacts=exported,
            redis=RedisSettings(url=cluster.url, durable_url=durable_url),
            feedback=FeedbackSettings(keys=[SecretStr(TEST_FEEDBACK_KEY)]),
        )
        async with app_client(settings) as http:
            assert (await http.get("/health/ready")).json()["feedback_durable"] is True
            answer = await http.post("/v1/recommend", json={"user_id": 1, "k": 5})
            assert answer.status_code == 200
            item = answer.json()["items"][0]["item_id"]
            event = {"user_id": 1, "item_id": item, "type": "click", "event_id": "roles-1"}
            assert (await http.post("/v1/feedback", json={"events": [event]})).status_code == 200
        registry, queue = make_registry(settings), make_retrain_queue(settings)
        try:
            registry.register(1, {"verdict": "pass", "failed_checks": []})
            queue.offer("roles|0", {"alerts": []}, 0, 60)
            assert len(queue.requests()) == 1
        finally:
            registry.close()
            queue.close()
        streams = [k.decode() for k in durable.scan_iter(match=f"{NAMESPACE}:*:feedback")]
        assert len(streams) == 1 and durable.xlen(streams[0]) == 1
        kinds = {k.decode().split(":")[2] for k in durable.scan_iter(count=1000)}
        assert {"feedback", "impressions", "answer"} <= kinds, kinds
        assert durable.dbsize() > 4  # + registry, queue
        assert keys_per_node(cluster) == on_cluster  # nothing durable reached the cluster
    finally:
        durable.close()
        server.kill()
        server.wait()


@pytest.mark.parametrize(
    ("store_url", "code", "message"),
    [
        ("cluster", 3, "set redis.durable_url to one Redis"),  # the settings refuse it
        (None, 2, "set CASCADE_REDIS__DURABLE_URL"),  # only --redis-url names the cluster
    ],
)
def test_a_cluster_without_a_durable_redis_is_refused(
    cluster: LocalCluster,
    store_url: str | None,
    code: int,
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CASCADE_REDIS__DURABLE_URL", raising=False)
    if store_url is None:
        monkeypatch.delenv("CASCADE_REDIS__URL", raising=False)
    else:
        monkeypatch.setenv("CASCADE_REDIS__URL", cluster.url)
    assert main(["materialize", "--redis-url", cluster.url]) == code
    assert message in capsys.readouterr().err
    assert sum(keys_per_node(cluster)) == 0


def test_key_slots_are_the_clusters(cluster: LocalCluster) -> None:
    names = [b"a{}b", b"{a}{b}", b"}{x}", b"cascade:emb:v3:user:{v3:user:17}:12305", b"plain"]
    with redis.Redis.from_url(cluster.node_urls()[0]) as node:
        for name in names:
            assert key_slot(name) == node.cluster("KEYSLOT", name), name


def test_gc_deletes_a_versions_rows_on_every_node(cluster: LocalCluster) -> None:
    from control.retention import _EmbeddingRows

    rows = RedisRows(cluster.url, "gc", timeout_s=5.0)
    try:
        for version in (1, 2):
            rows.write_table(version, "t", np.full((3_000, 4), version, np.float32))
            rows.mark_complete(version, {"t": 3_000}, 4)
        assert min(keys_per_node(cluster, "gc:emb:v1:*")) > 0
        assert _EmbeddingRows(cluster.url, "gc").delete(1) == 3_001  # the marker and each row
        assert sum(keys_per_node(cluster, "gc:emb:v1:*")) == 0
        assert rows.stored_tables(1) is None and rows.stored_tables(2) is not None
        kept, found = rows.fetch(2, "t", np.arange(3_000), 4)
        assert found.all() and (kept == 2).all()
    finally:
        rows.close()


def test_a_node_that_times_out_mid_batch_leaves_no_stale_replies(cluster: LocalCluster) -> None:
    """The reader sends every node its MGETs before reading any reply: when the first node
    read times out, the others' replies are unread, and must never answer the next batch."""
    table = np.arange(3_000 * 4, dtype=np.float32).reshape(3_000, 4)
    keys = np.arange(3_000)
    rows = RedisRows(cluster.url, "pause", timeout_s=0.2)
    try:
        rows.write_table(1, "t", table)
        got, found = rows.fetch(1, "t", keys, 4)
        assert found.all() and np.array_equal(got, table)
        reader = rows._local.reader
        slots = table_slots(1, "t", rows.buckets)
        first = reader.nodes[reader.node_of_slot[slots.min()]]  # its replies are read first
        with redis.Redis(host=first.host, port=first.port) as node:
            node.client_pause(600)
        with pytest.raises(ConnectionError):
            rows.fetch(1, "t", keys[::2], 4)
        time.sleep(0.7)  # the pause is over
        for batch in (keys[1::2], keys):  # other rows than the failed batch's
            got, found = rows.fetch(1, "t", batch, 4)
            assert found.all() and np.array_equal(got, table[batch])
    finally:
        rows.close()
