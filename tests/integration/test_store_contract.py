"""One contract, run against the real Redis store and the in-memory store."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest

from services.stores.base import OnlineStore, UserRecord
from services.stores.memory import InMemoryStore
from services.stores.redis import RedisStore
from tests.conftest import redis_url

pytestmark = pytest.mark.integration


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[OnlineStore]:
    if request.param == "memory":
        backend: OnlineStore = InMemoryStore()
    else:
        url = redis_url(db=9)
        if url is None:
            pytest.skip("no Redis answers on 127.0.0.1:6379 (.ci/run starts one)")
        backend = RedisStore(url, namespace="contract")
    await backend.start()
    if isinstance(backend, RedisStore):
        await backend.client.flushdb()
    yield backend
    await backend.close()


def _user(user_id: int, age: str = "30") -> UserRecord:
    return UserRecord(
        user_id,
        {"age": age, "gender": "F", "occupation": "writer", "zip_code": "01234"},
        recent=np.array([5, 9, 2], np.int64),
        seen=np.array([9, 2, 5, 77], np.int64),
    )


async def test_unknown_user_is_none_not_an_error(store: OnlineStore) -> None:
    found = await store.lookup(424242)
    assert found.user is None and len(found.unavailable) == 0


async def test_written_user_reads_back_in_one_lookup(store: OnlineStore) -> None:
    await store.write_users([_user(1), _user(2, age="41")])
    found = await store.lookup(2)
    assert found.user is not None
    assert found.user.attributes == {
        "age": "41",
        "gender": "F",
        "occupation": "writer",
        "zip_code": "01234",
    }
    assert found.user.recent.tolist() == [5, 9, 2]  # order kept: oldest first
    assert found.user.seen.tolist() == [2, 5, 9, 77]


async def test_rewriting_a_user_replaces_every_part(store: OnlineStore) -> None:
    await store.write_users([_user(3)])
    await store.write_users(
        [UserRecord(3, {"age": "50"}, np.array([1], np.int64), np.array([1], np.int64))]
    )
    found = await store.lookup(3)
    assert found.user is not None
    assert found.user.attributes == {"age": "50"}
    assert found.user.recent.tolist() == [1] and found.user.seen.tolist() == [1]


async def test_unavailable_items_come_with_every_lookup(store: OnlineStore) -> None:
    await store.set_unavailable(np.array([7, 3, 7], np.int64))
    assert (await store.lookup(1)).unavailable.tolist() == [3, 7]
    await store.set_unavailable(np.array([], np.int64))
    assert (await store.lookup(1)).unavailable.tolist() == []


async def test_feedback_is_appended_in_order(store: OnlineStore) -> None:
    ids = await store.append_feedback(
        [
            {"user_id": "1", "item_id": "5", "type": "impression"},
            {"user_id": "1", "item_id": "5", "type": "click", "model_version": "2"},
        ]
    )
    assert len(ids) == 2 and ids[0] != ids[1]
    events = await store.read_feedback()
    assert [e["type"] for e in events] == ["impression", "click"]
    assert events[1]["model_version"] == "2"


async def test_a_bad_event_stores_nothing_of_its_batch(store: OnlineStore) -> None:
    with pytest.raises(ValueError, match="lacks"):
        await store.append_feedback(
            [{"user_id": "1", "item_id": "5", "type": "click"}, {"user_id": "1"}]
        )
    assert await store.read_feedback() == []


async def test_ping(store: OnlineStore) -> None:
    assert await store.ping()
