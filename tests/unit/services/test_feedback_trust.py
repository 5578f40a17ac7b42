"""POST /v1/feedback trusts only what the server can vouch for (issue 30): a client key is
required, attribution goes through the server's own answer log (same user, an item the
answer showed), and a retried event moves no counter."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY
from pydantic import SecretStr

from services.api.credentials import fingerprint
from services.settings import FeedbackSettings, Settings
from tests.conftest import TEST_FEEDBACK_KEY, app_client

CLICK = {"user_id": 3, "item_id": 7, "type": "click"}


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@asynccontextmanager
async def _client(
    exported: Path, feedback: FeedbackSettings, headers: dict[str, str] | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(artifacts=exported, feedback=feedback)
    async with app_client(settings, headers or {}) as http:
        yield http


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _stored(client: httpx.AsyncClient) -> list[dict[str, str]]:
    store = client.app.state.gateway.store  # type: ignore[attr-defined]
    return [fields for _, fields in await store.read_stream("feedback")]


async def _answer(client: httpx.AsyncClient, user_id: int) -> dict[str, Any]:
    body: dict[str, Any] = (
        await client.post("/v1/recommend", json={"user_id": user_id, "k": 5})
    ).json()
    return body


async def test_feedback_without_a_valid_key_is_refused_and_nothing_is_stored(
    exported: Path,
) -> None:
    keys = FeedbackSettings(keys=[SecretStr("right")])
    async with _client(exported, keys) as client:
        anonymous = await client.post("/v1/feedback", json={"events": [CLICK]})
        wrong = await client.post(
            "/v1/feedback", json={"events": [CLICK]}, headers=_bearer("wrong")
        )
        assert anonymous.status_code == wrong.status_code == 401
        assert "feedback key" in wrong.json()["detail"]
        assert "wrong" not in wrong.text  # the presented key is never echoed
        assert await _stored(client) == []
        right = await client.post(
            "/v1/feedback", json={"events": [CLICK]}, headers=_bearer("right")
        )
        assert right.status_code == 200
        assert (await _stored(client))[0]["source"] == fingerprint("right")


async def test_with_no_key_configured_feedback_is_off_unless_told_to_run_open(
    exported: Path,
) -> None:
    async with _client(exported, FeedbackSettings(keys=[])) as client:
        refused = await client.post("/v1/feedback", json={"events": [CLICK]})
        assert refused.status_code == 401
        assert "none configured" in refused.json()["detail"]
        assert (await client.get("/health/ready")).json()["feedback_auth"] == "off"
    async with _client(exported, FeedbackSettings(keys=[], open=True)) as client:
        accepted = await client.post("/v1/feedback", json={"events": [CLICK]})
        assert accepted.status_code == 200
        assert (await _stored(client))[0]["source"] == "open"
        assert (await client.get("/health/ready")).json()["feedback_auth"] == "open"


async def test_a_rotated_key_file_applies_without_a_restart(exported: Path, tmp_path: Path) -> None:
    keys = tmp_path / "feedback-keys"
    keys.write_text("old\nnew\n")  # both accepted while clients move to the new one
    async with _client(exported, FeedbackSettings(keys=[], keys_file=keys)) as client:
        for key in ("old", "new"):
            sent = await client.post("/v1/feedback", json={"events": [CLICK]}, headers=_bearer(key))
            assert sent.status_code == 200
        keys.write_text("new\n")  # the rotation ends: the old key is withdrawn
        old = await client.post("/v1/feedback", json={"events": [CLICK]}, headers=_bearer("old"))
        assert old.status_code == 401
        keys.unlink()  # a mounted secret that went missing: refused, naming the file
        gone = await client.post("/v1/feedback", json={"events": [CLICK]}, headers=_bearer("new"))
        assert gone.status_code == 503 and str(keys) in gone.json()["detail"]


async def test_a_retried_event_moves_no_counter(client: httpx.AsyncClient) -> None:
    body = await _answer(client, 3)
    await client.app.state.gateway.impressions.flush()  # type: ignore[attr-defined]
    click = {
        "user_id": 3,
        "item_id": body["items"][0]["item_id"],
        "type": "click",
        "request_id": body["request_id"],
        "event_id": f"retry-{body['request_id']}",
    }
    served = {"model_version": "1", "type": "click", "trust": "served"}
    clicks, hits = (
        _value("cascade_feedback_events_total", **served),
        _value("cascade_hits_total", model_version="1"),
    )
    first = (await client.post("/v1/feedback", json={"events": [click]})).json()
    assert first["stored"] == 1
    assert _value("cascade_feedback_events_total", **served) == clicks + 1
    assert _value("cascade_hits_total", model_version="1") == hits + 1
    for _ in range(3):  # the client retries (a lost answer, a timeout)
        again = (await client.post("/v1/feedback", json={"events": [click]})).json()
        assert again["duplicates"] == 1 and again["ids"] == first["ids"]
    assert _value("cascade_feedback_events_total", **served) == clicks + 1
    assert _value("cascade_hits_total", model_version="1") == hits + 1
    assert _value("cascade_feedback_duplicates_total") >= 3


async def test_a_click_is_served_only_for_its_own_user_and_a_shown_item(
    client: httpx.AsyncClient,
) -> None:
    answer = await _answer(client, 5)
    await client.app.state.gateway.impressions.flush()  # type: ignore[attr-defined]
    shown = {item["item_id"] for item in answer["items"]}
    not_shown = next(i for i in range(10_000) if i not in shown)
    request_id = answer["request_id"]
    events = [
        {"user_id": 5, "item_id": min(shown), "type": "click", "request_id": request_id},
        {"user_id": 77, "item_id": min(shown), "type": "click", "request_id": request_id},
        {"user_id": 5, "item_id": not_shown, "type": "click", "request_id": request_id},
        {"user_id": 5, "item_id": min(shown), "type": "click", "model_version": 1},
    ]
    before = {
        trust: _value(
            "cascade_feedback_events_total",
            model_version="unattributed",
            type="click",
            trust=trust,
        )
        for trust in ("user_mismatch", "item_not_shown", "organic")
    }
    response = await client.post("/v1/feedback", json={"events": events})
    assert response.status_code == 200 and response.json()["stored"] == 4
    stored = (await _stored(client))[-4:]
    assert [e["trust"] for e in stored] == ["served", "user_mismatch", "item_not_shown", "organic"]
    # only the vouched click names a version, and only it may be the answer's hit
    assert [e["model_version"] for e in stored] == ["1", "", "", ""]
    assert [e.get("hit") for e in stored] == ["1", None, None, None]
    assert {e["source"] for e in stored} == {fingerprint(TEST_FEEDBACK_KEY)}
    for trust, value in before.items():
        labels = {"model_version": "unattributed", "type": "click", "trust": trust}
        assert _value("cascade_feedback_events_total", **labels) == value + 1


@pytest.mark.parametrize("event_type", ["click", "impression"])
async def test_another_users_answer_never_makes_a_hit(
    client: httpx.AsyncClient, event_type: str
) -> None:
    answer = await _answer(client, 5)
    await client.app.state.gateway.impressions.flush()  # type: ignore[attr-defined]
    forged = {
        "user_id": 6,
        "item_id": answer["items"][0]["item_id"],
        "type": event_type,
        "request_id": answer["request_id"],
    }
    assert (await client.post("/v1/feedback", json={"events": [forged]})).status_code == 200
    genuine = {**forged, "user_id": 5, "type": "click"}
    assert (await client.post("/v1/feedback", json={"events": [genuine]})).status_code == 200
    stored = (await _stored(client))[-2:]
    assert stored[0]["trust"] == "user_mismatch" and "hit" not in stored[0]
    assert stored[1]["trust"] == "served" and stored[1]["hit"] == "1"  # still the first hit
