"""POST /v1/admin/alerts on the real app (create_app, its lifespan and error handlers) with a
stand-in gateway (the webhook does not touch the request path) and the embedded file queue."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from services.api.app import create_app
from services.settings import Settings
from services.state.retrain_queue import FileRetrainQueue
from services.util.local_redis import free_port

TOKEN = "s3cret-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class IdleGateway:
    """Enough of a Gateway for the app's lifespan."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.releases: dict[int, Any] = {}
        self.store_monitor = None

    async def start(self) -> None: ...

    async def close(self) -> None: ...


def payload(
    status: str = "firing",
    alertname: str = "CascadeFeatureDrift",
    action: str | None = "retrain",
    starts_at: str = "2026-11-22T16:05:00Z",
    group_key: str = '{}/{action="retrain"}:{alertname="CascadeFeatureDrift", model_version="3"}',
) -> dict[str, Any]:
    """An Alertmanager v4 notification with one alert."""
    labels = {"alertname": alertname, "model_version": "3", "feature": "age", "severity": "warning"}
    if action is not None:
        labels["action"] = action
    return {
        "version": "4",
        "groupKey": group_key,
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "cascade-retrain",
        "groupLabels": {"alertname": alertname, "model_version": "3"},
        "commonLabels": labels,
        "commonAnnotations": {"summary": "drift"},
        "externalURL": "http://alertmanager:9093",
        "alerts": [
            {
                "status": status,
                "labels": labels,
                "annotations": {"summary": "drift"},
                "startsAt": starts_at,
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://prometheus:9090/graph",
                "fingerprint": "c0ffee0123456789",
            }
        ],
    }


def decisions() -> dict[str, float]:
    return {
        d: REGISTRY.get_sample_value("cascade_retrain_requests_total", {"decision": d}) or 0.0
        for d in ("enqueued", "duplicate", "cooldown", "resolved", "not_retrain")
    }


async def _client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(gateway=IdleGateway(settings))  # type: ignore[arg-type]
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            yield http


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async for http in _client(Settings(artifacts=tmp_path, admin={"token": TOKEN})):
        yield http


def queued(tmp_path: Path) -> list[dict[str, Any]]:
    return [r.trigger for r in FileRetrainQueue(tmp_path / "retrain" / "queue.json").requests()]


async def test_a_firing_retrain_alert_enqueues_one_request(
    client: httpx.AsyncClient, tmp_path: Path
) -> None:
    before = decisions()
    response = await client.post("/v1/admin/alerts", json=payload(), headers=AUTH)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["decision"] == "enqueued" and body["request_id"]
    [trigger] = queued(tmp_path)
    assert trigger["alerts"] == [
        {
            "alertname": "CascadeFeatureDrift",
            "model_version": "3",
            "feature": "age",
            "severity": "warning",
            "starts_at": "2026-11-22T16:05:00+00:00",
            "fingerprint": "c0ffee0123456789",
        }
    ]
    assert trigger["window_start"] == "2026-11-22T16:00:00+00:00"
    assert decisions()["enqueued"] == before["enqueued"] + 1


async def test_resends_of_the_group_are_duplicates(
    client: httpx.AsyncClient, tmp_path: Path
) -> None:
    first = (await client.post("/v1/admin/alerts", json=payload(), headers=AUTH)).json()
    before = decisions()
    for _ in range(3):
        again = await client.post("/v1/admin/alerts", json=payload(), headers=AUTH)
        assert again.json() == {"decision": "duplicate", "request_id": first["request_id"]}
    assert len(queued(tmp_path)) == 1
    assert decisions()["duplicate"] == before["duplicate"] + 3


async def test_another_group_or_window_within_the_cooldown_enqueues_nothing(
    client: httpx.AsyncClient, tmp_path: Path
) -> None:
    await client.post("/v1/admin/alerts", json=payload(), headers=AUTH)
    before = decisions()
    later = payload(starts_at="2026-11-22T18:30:00Z")  # next data window, same group
    other = payload(alertname="CascadeCtrDrop", group_key='{}:{alertname="CascadeCtrDrop"}')
    for body in (later, other):
        response = await client.post("/v1/admin/alerts", json=body, headers=AUTH)
        assert response.json() == {"decision": "cooldown", "request_id": None}
    assert len(queued(tmp_path)) == 1
    assert decisions()["cooldown"] == before["cooldown"] + 2


async def test_after_the_cooldown_a_new_window_enqueues_again(tmp_path: Path) -> None:
    settings = Settings(
        artifacts=tmp_path, admin={"token": TOKEN}, retrain_trigger={"cooldown_s": 0}
    )
    async for http in _client(settings):
        first = await http.post("/v1/admin/alerts", json=payload(), headers=AUTH)
        later = payload(starts_at="2026-11-22T18:30:00Z")
        second = await http.post("/v1/admin/alerts", json=later, headers=AUTH)
        assert [first.json()["decision"], second.json()["decision"]] == ["enqueued", "enqueued"]
    assert len(queued(tmp_path)) == 2


async def test_resolved_notifications_are_acknowledged_and_ignored(
    client: httpx.AsyncClient, tmp_path: Path
) -> None:
    before = decisions()
    response = await client.post("/v1/admin/alerts", json=payload("resolved"), headers=AUTH)
    assert response.json() == {"decision": "resolved", "request_id": None}
    assert queued(tmp_path) == []
    assert decisions()["resolved"] == before["resolved"] + 1


async def test_alerts_without_the_retrain_label_are_ignored(
    client: httpx.AsyncClient, tmp_path: Path
) -> None:
    before = decisions()
    for action in (None, "page"):
        body = payload(alertname="CascadeErrorRatioHigh", action=action)
        response = await client.post("/v1/admin/alerts", json=body, headers=AUTH)
        assert response.json() == {"decision": "not_retrain", "request_id": None}
    assert queued(tmp_path) == []
    assert decisions()["not_retrain"] == before["not_retrain"] + 2


async def test_only_the_firing_retrain_alerts_of_a_mixed_group_count(
    client: httpx.AsyncClient, tmp_path: Path
) -> None:
    body = payload()
    resolved = copy.deepcopy(body["alerts"][0])
    resolved.update(status="resolved", startsAt="2026-11-22T10:00:00Z")
    other = copy.deepcopy(body["alerts"][0])
    other["labels"] = {"alertname": "CascadeErrorRatioHigh"}
    body["alerts"] += [resolved, other]
    response = await client.post("/v1/admin/alerts", json=body, headers=AUTH)
    assert response.json()["decision"] == "enqueued"
    [trigger] = queued(tmp_path)
    assert trigger["firing"] == 1
    assert trigger["window_start"] == "2026-11-22T16:00:00+00:00"  # not the resolved one's


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}],
    ids=["missing", "wrong", "not-bearer"],
)
async def test_a_missing_or_wrong_token_is_401(
    client: httpx.AsyncClient, tmp_path: Path, headers: dict[str, str]
) -> None:
    before = decisions()
    response = await client.post("/v1/admin/alerts", json=payload(), headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert "bearer token" in response.json()["detail"]
    assert queued(tmp_path) == [] and decisions() == before


async def test_the_token_is_checked_before_the_body(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/admin/alerts", json={"version": "3"})
    assert response.status_code == 401


async def test_without_a_configured_token_the_endpoint_is_off(tmp_path: Path) -> None:
    async for http in _client(Settings(artifacts=tmp_path)):
        response = await http.post("/v1/admin/alerts", json=payload(), headers=AUTH)
        assert response.status_code == 404
        assert "CASCADE_ADMIN__TOKEN" in response.json()["detail"]
        anonymous = await http.post("/v1/admin/alerts", json=payload())
        assert anonymous.status_code == 401  # no credentials: unauthenticated first
    assert queued(tmp_path) == []


async def test_the_token_can_come_from_a_file_read_on_every_call(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(f"{TOKEN}\n")
    async for http in _client(Settings(artifacts=tmp_path, admin={"token_file": token_file})):
        ok = await http.post("/v1/admin/alerts", json=payload("resolved"), headers=AUTH)
        assert ok.status_code == 200
        token_file.write_text("rotated\n")
        old = await http.post("/v1/admin/alerts", json=payload("resolved"), headers=AUTH)
        assert old.status_code == 401
        new = {"Authorization": "Bearer rotated"}
        assert (
            await http.post("/v1/admin/alerts", json=payload("resolved"), headers=new)
        ).is_success
        token_file.unlink()
        gone = await http.post("/v1/admin/alerts", json=payload("resolved"), headers=new)
        assert gone.status_code == 503
        assert str(token_file) in gone.json()["detail"] and "rotated" not in gone.text


def test_token_and_token_file_together_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="token or token_file, not both"):
        Settings(artifacts=tmp_path, admin={"token": TOKEN, "token_file": tmp_path / "t"})


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda b: b.pop("groupKey"), "groupKey"),
        (lambda b: b.update(version="3"), "version"),
        (lambda b: b.update(status="pending"), "status"),
        (lambda b: b.update(alerts=[]), "alerts"),
        (lambda b: b["alerts"][0].update(startsAt="yesterday"), "startsAt"),
        (lambda b: b["alerts"][0]["labels"].update(model_version=3), "model_version"),
        (lambda b: b["alerts"][0].update(endsAt=0), "endsAt"),
        (lambda b: b.update(truncatedAlerts="1"), "truncatedAlerts"),
    ],
    ids=[
        "no-group-key",
        "version",
        "status",
        "no-alerts",
        "starts-at",
        "label-not-text",
        "ends-at-number",
        "count-as-text",
    ],
)
async def test_a_malformed_payload_is_422_naming_the_field(
    client: httpx.AsyncClient, tmp_path: Path, change: Any, field: str
) -> None:
    body = payload()
    change(body)
    response = await client.post("/v1/admin/alerts", json=body, headers=AUTH)
    assert response.status_code == 422
    assert any(field in error["loc"] for error in response.json()["detail"]), response.text
    assert queued(tmp_path) == []


async def test_fields_of_a_later_alertmanager_are_ignored(client: httpx.AsyncClient) -> None:
    body = payload()
    body["newField"] = {"x": 1}
    body["alerts"][0]["newField"] = "y"
    response = await client.post("/v1/admin/alerts", json=body, headers=AUTH)
    assert response.json()["decision"] == "enqueued"


async def test_an_unreachable_queue_is_503_so_alertmanager_retries(tmp_path: Path) -> None:
    settings = Settings(
        artifacts=tmp_path,
        admin={"token": TOKEN},
        redis={"url": f"redis://127.0.0.1:{free_port()}/0"},
    )
    before = decisions()
    async for http in _client(settings):
        response = await http.post("/v1/admin/alerts", json=payload(), headers=AUTH)
        assert response.status_code == 503
        assert "retrain queue" in response.json()["detail"]
    assert decisions() == before


async def test_openapi_documents_every_status_the_webhook_gives(
    client: httpx.AsyncClient,
) -> None:
    operation = (await client.get("/openapi.json")).json()["paths"]["/v1/admin/alerts"]["post"]
    assert {"200", "400", "401", "404", "413", "422", "503"} <= set(operation["responses"])
    assert operation["security"] == [{"HTTPBearer": []}]
