"""One contract, run against the real Redis store and the in-memory store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from services.stores.base import Answer, OnlineStore, UserRecord
from services.stores.memory import InMemoryStore
from services.stores.redis import RedisStore
from tests.conftest import redis_url

pytestmark = pytest.mark.integration


@pytest.fixture(params=["memory", "memory+files", "redis"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OnlineStore]:
    if request.param == "memory":
        backend: OnlineStore = InMemoryStore()
    elif request.param == "memory+files":
        backend = InMemoryStore(stream_dir=tmp_path / "streams")
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
    appended = await store.append_feedback(
        [
            {"user_id": "1", "item_id": "5", "type": "impression"},
            {"user_id": "1", "item_id": "5", "type": "click", "model_version": "2"},
        ],
        max_len=1000,
        idempotency_ttl_s=60,
    )
    ids = appended.ids
    assert len(ids) == 2 and ids[0] != ids[1] and appended.duplicates == 0
    events = await store.read_feedback()
    assert [e["type"] for e in events] == ["impression", "click"]
    assert events[1]["model_version"] == "2"


async def test_a_bad_event_stores_nothing_of_its_batch(store: OnlineStore) -> None:
    with pytest.raises(ValueError, match="lacks"):
        await store.append_feedback(
            [{"user_id": "1", "item_id": "5", "type": "click"}, {"user_id": "1"}],
            max_len=1000,
            idempotency_ttl_s=60,
        )
    assert await store.read_feedback() == []


async def test_ping(store: OnlineStore) -> None:
    assert await store.ping()


def _impression(request_id: str, version: int, items: str = "5 9 2") -> dict[str, str]:
    return {
        "request_id": request_id,
        "user_id": "1",
        "model_version": str(version),
        "items": items,
        "scores": "0.9 0.5 0.1",
        "degraded": "0",
        "timestamp": "1700000000",
    }


async def test_impressions_resolve_their_answer_and_read_back_in_order(
    store: OnlineStore,
) -> None:
    await store.append_impressions(
        [_impression("a" * 32, 1), _impression("b" * 32, 2, "7")], max_len=1000, ttl_s=60
    )
    assert await store.answers(["b" * 32, "c" * 32, "a" * 32]) == [
        Answer(2, "1", frozenset({"7"})),
        None,
        Answer(1, "1", frozenset({"5", "9", "2"})),
    ]
    entries = await store.read_stream("impressions")
    assert [fields["request_id"] for _, fields in entries] == ["a" * 32, "b" * 32]
    after_first = await store.read_stream("impressions", after=entries[0][0])
    assert [fields["request_id"] for _, fields in after_first] == ["b" * 32]
    assert await store.read_stream("impressions", after=entries[1][0]) == []
    with pytest.raises(ValueError, match="unknown stream"):
        await store.read_stream("clicks")


async def test_only_the_first_outcome_of_a_request_is_a_hit(store: OnlineStore) -> None:
    assert await store.first_hits(["r1", "r2", "r1"], ttl_s=60) == [True, True, False]
    assert await store.first_hits(["r2", "r3"], ttl_s=60) == [False, True]


async def test_feedback_stream_reads_back_with_ids(store: OnlineStore) -> None:
    appended = await store.append_feedback(
        [{"user_id": "1", "item_id": "2", "type": "click", "request_id": "d" * 32}],
        max_len=1000,
        idempotency_ttl_s=60,
    )
    entries = await store.read_stream("feedback")
    assert [i for i, _ in entries] == appended.ids
    assert entries[0][1]["request_id"] == "d" * 32


async def test_file_backed_streams_survive_a_restart(tmp_path: Path) -> None:
    """The embedded default with a stream directory: what was acknowledged is read back by
    a new process (a restarted gateway, or ``cascade retrain``), torn lines skipped."""
    first = InMemoryStore(stream_dir=tmp_path)
    await first.start()
    appended = await first.append_feedback(
        [{"user_id": "1", "item_id": "2", "type": "click", "event_id": "e1"}],
        max_len=1000,
        idempotency_ttl_s=60,
    )
    await first.append_impressions([_impression("a" * 32, 3)], max_len=1000, ttl_s=60)
    with (tmp_path / "feedback.jsonl").open("a") as out:
        out.write('["17000')  # a crash in the middle of a line
    second = InMemoryStore(stream_dir=tmp_path)
    await second.start()
    assert [i for i, _ in await second.read_stream("feedback")] == appended.ids
    assert len(await second.read_stream("impressions")) == 1
    again = await second.append_feedback(
        [{"user_id": "1", "item_id": "2", "type": "click", "event_id": "e1"}],
        max_len=1000,
        idempotency_ttl_s=60,
    )
    assert again.duplicates == 1 and again.ids == appended.ids and again.new == [False]
    later = await second.append_feedback(
        [{"user_id": "1", "item_id": "3", "type": "click"}], max_len=1000, idempotency_ttl_s=60
    )
    entries = await second.read_stream("feedback")
    assert [i for i, _ in entries] == appended.ids + later.ids  # ids keep increasing
    third = InMemoryStore(stream_dir=tmp_path)
    await third.start()
    assert await third.read_stream("feedback") == entries  # nothing lost to the torn line
    # answers logged before the restart still vouch for their clicks
    assert await third.answers(["a" * 32]) == [Answer(3, "1", frozenset({"5", "9", "2"}))]


async def test_file_backed_streams_are_read_live_by_another_process(tmp_path: Path) -> None:
    """A controller (another process) reads what the gateway appends, without restarting."""
    gateway, controller = InMemoryStore(stream_dir=tmp_path), InMemoryStore(stream_dir=tmp_path)
    await gateway.start()
    await controller.start()
    await gateway.append_impressions([_impression("a" * 32, 1)], max_len=1000, ttl_s=60)
    first = await controller.read_stream("impressions")
    await gateway.append_impressions([_impression("b" * 32, 2)], max_len=1000, ttl_s=60)
    later = await controller.read_stream("impressions", after=first[-1][0])
    assert [f["request_id"] for _, f in first + later] == ["a" * 32, "b" * 32]
    own = await gateway.read_stream("impressions")
    assert len(own) == 2  # its own appends are not read twice
