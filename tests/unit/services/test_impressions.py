"""Impression logging and server-side attribution of feedback (issue 9)."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
from prometheus_client import REGISTRY

from services.events.impressions import ImpressionLog, impression_record
from services.serving.gateway import Gateway
from services.settings import ImpressionSettings
from services.stores.memory import InMemoryStore


def _gateway(client: httpx.AsyncClient) -> Gateway:
    return client.app.state.gateway  # type: ignore[attr-defined,no-any-return]


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_every_answer_is_logged_as_an_impression_set(client: httpx.AsyncClient) -> None:
    body = (await client.post("/v1/recommend", json={"user_id": 3, "k": 5})).json()
    gateway = _gateway(client)
    assert gateway.impressions is not None
    await gateway.impressions.flush()
    logged = [f for _, f in await gateway.store.read_stream("impressions")]
    mine = [f for f in logged if f["request_id"] == body["request_id"]]
    assert len(mine) == 1
    assert mine[0]["items"].split() == [str(i["item_id"]) for i in body["items"]]
    assert len(mine[0]["scores"].split()) == 5
    assert mine[0]["model_version"] == "1" and mine[0]["user_id"] == "3"
    assert mine[0]["degraded"] == "0" and mine[0]["reasons"] == ""
    assert float(mine[0]["latency_ms"]) > 0


async def test_clicks_are_attributed_to_the_version_that_served_them(
    client: httpx.AsyncClient,
) -> None:
    body = (await client.post("/v1/recommend", json={"user_id": 3, "k": 5})).json()
    await _gateway(client).impressions.flush()  # type: ignore[union-attr]
    item = body["items"][0]["item_id"]
    served = {"model_version": "1", "type": "click", "trust": "served"}
    clicks_before = _value("cascade_feedback_events_total", **served)
    hits_before = _value("cascade_hits_total", model_version="1")
    event = {"user_id": 3, "item_id": item, "type": "click", "request_id": body["request_id"]}
    claimed = {**event, "model_version": 42}  # the client's claim is ignored
    response = await client.post("/v1/feedback", json={"events": [event, claimed]})
    assert response.status_code == 200
    stored = [f for _, f in await _gateway(client).store.read_stream("feedback")]
    assert [e["model_version"] for e in stored[-2:]] == ["1", "1"]
    assert _value("cascade_feedback_events_total", **served) == clicks_before + 2
    assert _value("cascade_hits_total", model_version="1") == hits_before + 1  # once per set


async def test_a_click_before_its_impression_set_is_written_is_attributed(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer runs behind the answers: a user who clicks at once must not be counted
    as unattributed because the set is still queued (or being written)."""
    gateway = _gateway(client)
    release = asyncio.Event()
    real_append = gateway.store.append_impressions

    async def held(*args: object, **kwargs: object) -> None:
        await release.wait()
        await real_append(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(gateway.store, "append_impressions", held)
    body = (await client.post("/v1/recommend", json={"user_id": 3, "k": 5})).json()
    assert await gateway.store.answers([body["request_id"]]) == [None]
    event = {"user_id": 3, "item_id": body["items"][0]["item_id"], "type": "click"}
    event["request_id"] = body["request_id"]
    assert (await client.post("/v1/feedback", json={"events": [event]})).status_code == 200
    stored = [f for _, f in await gateway.store.read_stream("feedback")]
    assert stored[-1]["model_version"] == "1"
    release.set()
    await asyncio.sleep(0.05)
    assert gateway.impressions is not None
    assert gateway.impressions.pending_answer(body["request_id"]) is None  # written: forgotten


async def test_an_unknown_request_id_is_unattributed(client: httpx.AsyncClient) -> None:
    unknown = {"model_version": "unattributed", "type": "click", "trust": "unknown_request"}
    before = _value("cascade_feedback_events_total", **unknown)
    event = {"user_id": 3, "item_id": 1, "type": "click", "request_id": "0" * 32}
    assert (await client.post("/v1/feedback", json={"events": [event]})).status_code == 200
    stored = [f for _, f in await _gateway(client).store.read_stream("feedback")]
    assert stored[-1]["model_version"] == "" and stored[-1]["request_id"] == "0" * 32
    assert stored[-1]["trust"] == "unknown_request"
    after = _value("cascade_feedback_events_total", **unknown)
    assert after == before + 1


async def test_a_full_queue_drops_and_counts_instead_of_waiting() -> None:
    log = ImpressionLog(InMemoryStore(), ImpressionSettings(queue=10))
    before = _value("cascade_impressions_dropped_total", reason="queue_full")
    record = impression_record("a" * 32, 1, 1, np.arange(3), np.ones(3))
    for _ in range(15):  # no writer running: the queue fills
        log.record(record, {1})
    assert _value("cascade_impressions_dropped_total", reason="queue_full") == before + 5


class _FailingStore(InMemoryStore):
    async def append_impressions(self, records: object, max_len: int, ttl_s: int) -> None:
        raise ConnectionError("store is away")


async def test_a_failing_store_drops_and_counts_without_failing_requests() -> None:
    log = ImpressionLog(_FailingStore(), ImpressionSettings())
    before = _value("cascade_impressions_dropped_total", reason="store_error")
    log.start()
    record = impression_record("b" * 32, 1, 1, np.arange(3), np.ones(3))
    for _ in range(4):
        log.record(record, {1})
    for _ in range(50):
        if _value("cascade_impressions_dropped_total", reason="store_error") == before + 4:
            break
        await asyncio.sleep(0.01)
    await log.close()
    assert _value("cascade_impressions_dropped_total", reason="store_error") == before + 4


class _SlowStore(InMemoryStore):
    async def append_impressions(self, records: object, max_len: int, ttl_s: int) -> None:
        await asyncio.sleep(0.2)
        await super().append_impressions(records, max_len, ttl_s)  # type: ignore[arg-type]


async def test_flush_waits_for_the_batch_the_writer_holds() -> None:
    """A flush that only drained the queue returned while the background writer was still
    writing the set it had taken: a reader right after it missed that set."""
    store = _SlowStore()
    log = ImpressionLog(store, ImpressionSettings())
    log.start()
    log.record(impression_record("c" * 32, 1, 1, np.arange(3), np.ones(3)), {1})
    await asyncio.sleep(0.05)  # the writer has taken the set and is writing it
    pending = log.pending_answer("c" * 32)
    assert pending is not None and pending.version == 1 and pending.items == {"0", "1", "2"}
    assert await store.read_stream("impressions") == []
    await log.flush()
    assert [f["request_id"] for _, f in await store.read_stream("impressions")] == ["c" * 32]
    await log.close()
