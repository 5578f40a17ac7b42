"""The desired serving state: one contract for the Redis and the file store (issue 10)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from core.errors import CascadeError
from services.state.desired_state import (
    DesiredState,
    DesiredStateConflict,
    DesiredStateStore,
    FileDesiredState,
    RedisDesiredState,
    describe,
)
from tests.conftest import redis_url

pytestmark = pytest.mark.integration


@pytest.fixture(params=["file", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DesiredStateStore]:
    if request.param == "file":
        yield FileDesiredState(tmp_path / "rollout" / "desired.json")
        return
    url = redis_url(db=13)
    if url is None:
        pytest.skip("no Redis answers on 127.0.0.1:6379 (.ci/run starts one)")
    redis.Redis.from_url(url).flushdb()
    backend = RedisDesiredState(url, namespace="desired-test")
    yield backend
    backend.close()


def test_nothing_written_reads_none(store: DesiredStateStore) -> None:
    assert store.read() is None
    assert describe(None).startswith("no desired state")


def test_writes_are_compare_and_set_on_the_revision(store: DesiredStateStore) -> None:
    first = DesiredState(production=1, revision=1, reason="adopted")
    store.write(first, expected_revision=0)
    assert store.read() == first
    canary = first.next(canary=2, canary_weight=0.05, step=1, reason="rollout step 1")
    assert canary.revision == 2
    store.write(canary, expected_revision=1)
    with pytest.raises(DesiredStateConflict, match="since revision 1"):
        store.write(first.next(production=3), expected_revision=1)  # a stale writer
    with pytest.raises(DesiredStateConflict):
        store.write(DesiredState(production=9, revision=1), expected_revision=0)
    assert store.read() == canary
    assert "canary 2 at 5% (step 1)" in describe(store.read())


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"production": 1, "canary": 1}, "must differ"),
        ({"production": 1, "canary_weight": 0.5}, "needs a canary"),
        ({"production": 1, "canary": 2, "canary_weight": 1.5}, "canary_weight"),
        ({"production": 0}, "production"),
    ],
)
def test_invalid_states_are_refused(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DesiredState(**fields)


def test_a_corrupted_stored_state_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "desired.json"
    path.write_text('{"production": "one"}')
    with pytest.raises(CascadeError, match=r"desired state in .*desired\.json is invalid"):
        FileDesiredState(path).read()


def test_replica_reports_are_read_back_until_they_expire(store: DesiredStateStore) -> None:
    store.report("gw-1", {"replica": "gw-1", "applied_revision": 3}, ttl_s=60)
    store.report("gw-2", {"replica": "gw-2", "canary_failed": 4}, ttl_s=0.01)
    store.report("gw-1", {"replica": "gw-1", "applied_revision": 4}, ttl_s=60)  # replaces
    import time

    time.sleep(0.05)
    assert store.reports() == [{"replica": "gw-1", "applied_revision": 4}]


def test_pin_production_writes_a_state_only_when_none_exists(tmp_path: Path) -> None:
    from services.settings import Settings
    from services.state.desired_state import pin_production

    settings = Settings(artifacts=tmp_path)
    assert pin_production(settings, None) is None
    pinned = pin_production(settings, 3)
    assert pinned is not None and (pinned.production, pinned.revision) == (3, 1)
    assert pin_production(settings, 5) == pinned  # an existing state is never overwritten
