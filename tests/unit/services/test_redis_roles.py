"""Redis by role in the settings: one URL serves both roles; a Cluster only for the
rebuildable one, and never without a durable Redis beside it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.settings import RedisSettings
from services.util.redis_client import SentinelTarget, is_cluster, node_url, sentinel_target


def test_one_url_is_both_roles() -> None:
    settings = RedisSettings(url="redis://cache:6379/0")
    assert settings.durable == "redis://cache:6379/0"
    assert RedisSettings().durable is None


def test_a_durable_url_takes_the_durable_role() -> None:
    settings = RedisSettings(url="redis+cluster://cache:7000", durable_url="redis://state:6379/0")
    assert settings.durable == "redis://state:6379/0"
    assert is_cluster(settings.url or "") and not is_cluster(settings.durable)


@pytest.mark.parametrize(
    ("url", "durable_url", "message"),
    [
        ("redis+cluster://cache:7000", None, "set redis.durable_url to one Redis"),
        ("redis://cache:6379", "redis+cluster://state:7000", "not a Cluster"),
        ("redis://cache:6379", "rediss+cluster://state:7000", "not a Cluster"),
        (None, "redis://state:6379", "redis.durable_url needs redis.url"),
        ("redis+sentinel://s1:26379/cascade/0", None, "goes in redis.durable_url"),
        ("redis://cache:6379", "redis+sentinel://s1/cascade/0", "host:port pairs"),
        ("redis://cache:6379", "redis+sentinel://s1:26379", "ends with /service/db"),
        ("redis://cache:6379", "redis+sentinel://s1:26379/cascade/x", "ends with /service/db"),
    ],
)
def test_roles_that_cannot_work_are_refused(
    url: str | None, durable_url: str | None, message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        RedisSettings(url=url, durable_url=durable_url)


def test_a_cluster_url_names_its_nodes_plain_scheme() -> None:
    assert node_url("redis+cluster://:pw@host:7000/0") == "redis://:pw@host:7000/0"
    assert node_url("rediss+cluster://host:7000") == "rediss://host:7000"
    assert node_url("redis://host:6379/2") == "redis://host:6379/2"


def test_a_sentinel_url_names_the_sentinels_the_service_and_the_db() -> None:
    settings = RedisSettings(
        url="redis://cache:6379/0", durable_url="redis+sentinel://s1:26379,s2:26380/cascade/2"
    )
    assert settings.durable is not None
    assert sentinel_target(settings.durable) == SentinelTarget(
        [("s1", 26379), ("s2", 26380)], "cascade", 2, None, False
    )
    assert sentinel_target("rediss+sentinel://:p%40ss@s1:26379/main") == SentinelTarget(
        [("s1", 26379)], "main", 0, "p@ss", True
    )
