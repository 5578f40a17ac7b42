"""The cache's minimal Redis connection against the real Redis: db selection, error replies,
a dropped connection, nothing listening."""

from __future__ import annotations

import hiredis
import pytest
import redis

from services.embedding_cache.resp import RespConnection
from tests.conftest import redis_url

pytestmark = pytest.mark.integration


@pytest.fixture
def url() -> str:
    found = redis_url(db=12)
    if found is None:
        pytest.skip("no Redis answers on 127.0.0.1:6379 (.ci/run starts one)")
    return found


def test_reads_the_database_of_the_url(url: str) -> None:
    client = redis.Redis.from_url(url)
    client.set("resp-test", b"\x00\x01binary")
    connection = RespConnection(url, timeout_s=1.0)
    assert connection.execute("MGET", "resp-test", "resp-test-absent") == [b"\x00\x01binary", None]
    connection.close()
    client.delete("resp-test")


def test_the_connection_carries_its_name(url: str) -> None:
    connection = RespConnection(url, timeout_s=1.0, name="resp-test")
    assert connection.execute("CLIENT", "GETNAME") == b"resp-test"
    connection.close()


def test_an_error_reply_raises_and_the_connection_stays_usable(url: str) -> None:
    connection = RespConnection(url, timeout_s=1.0)
    with pytest.raises(hiredis.ReplyError, match="unknown command"):
        connection.execute("NO-SUCH-COMMAND")
    assert connection.execute("PING") == b"PONG"
    connection.close()


def test_a_dropped_connection_raises_once_then_reconnects(url: str) -> None:
    connection = RespConnection(url, timeout_s=1.0)
    client_id = connection.execute("CLIENT", "ID")
    redis.Redis.from_url(url).client_kill_filter(_id=client_id)
    with pytest.raises(ConnectionError):
        connection.execute("PING")
    assert connection.execute("PING") == b"PONG"
    connection.close()


def test_nothing_listening_is_a_connection_error() -> None:
    connection = RespConnection("redis://127.0.0.1:1/0", timeout_s=0.05)
    with pytest.raises(ConnectionError, match=r"127\.0\.0\.1:1\b"):
        connection.execute("PING")


def test_only_plain_redis_urls() -> None:
    parsed = RespConnection("redis://user:secret@cache.internal:6380/3", timeout_s=1.0)
    assert (parsed.host, parsed.port, parsed.username, parsed.password, parsed.db) == (
        "cache.internal",
        6380,
        "user",
        "secret",
        3,
    )
    assert not RespConnection.supports("rediss://cache.internal:6380/0")
    with pytest.raises(ValueError, match="redis://"):
        RespConnection("unix:///tmp/redis.sock", timeout_s=1.0)
