"""The data set's own ids at the serving boundary (issue 33): strings or integers in requests,
answers, feedback and rules, translated once to the release's internal ids and back.

The string-id release is the test export with id maps written beside it: user ``n`` is
``user-n`` and item ``n`` is ``sku-n`` (the maps are all the serving side needs).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest
from prometheus_client import REGISTRY

from core.errors import ArtifactError
from core.export.repository import sha256
from core.export.verify import MANIFEST
from core.ids import ITEM_ID_MAP, MAX_ID_LENGTH, UNKNOWN, USER_ID_MAP, IdMap
from services.serving.ids import ReleaseIds
from services.serving.release import load_release
from services.serving.routing import VersionRouter
from services.serving.rules import Boost, Exclusion, Pin, Rules
from services.settings import Settings
from tests.conftest import app_client

SKU = "sku-{}"
FAST = "application/json"  # answered by the short path (services/api/fast_recommend.py)
ROUTE = "application/vnd.cascade+json"  # JSON that only FastAPI's route answers


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _write_maps(release: Path, users: list[str], items: list[str], listed: bool = True) -> None:
    """Save id maps into a release and (``listed``) record them in its manifest's checksums."""
    online = release / "online"
    IdMap("str", users).save(online / USER_ID_MAP)
    IdMap("str", items).save(online / ITEM_ID_MAP)
    if not listed:
        return
    manifest = json.loads((release / MANIFEST).read_text())
    for name in (USER_ID_MAP, ITEM_ID_MAP):
        path = online / name
        manifest["files"][str(path.relative_to(release.parent.parent))] = sha256(path)
    (release / MANIFEST).write_text(json.dumps(manifest))


def _string_ids(exported: Path, root: Path, listed: bool = True) -> Path:
    """A copy of the test export whose ids are strings: ``user-n`` and ``sku-n``."""
    shutil.copytree(exported, root, dirs_exist_ok=True)
    release = root / "releases" / "1"
    n_users = int(pd.read_parquet(release / "online" / "users.parquet")["user_id"].max())
    n_items = int(np.load(release / "item_ids.npy").max())
    _write_maps(
        release,
        [f"user-{n}" for n in range(1, n_users + 1)],
        [SKU.format(n) for n in range(1, n_items + 1)],
        listed,
    )
    return root


@pytest.fixture(scope="module")
def string_export(exported: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _string_ids(exported, tmp_path_factory.mktemp("string-ids"))


@asynccontextmanager
async def _client(root: Path, **settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with app_client(Settings(artifacts=root, **settings)) as http:
        yield http


@pytest.fixture
async def strings(string_export: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with _client(string_export) as http:
        yield http


@pytest.fixture
def fixed_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """One request time, so that two gateways' answers can be compared."""
    monkeypatch.setattr("services.serving.gateway.time.time", lambda: 1_700_000_000.0)


async def _recommend(
    client: httpx.AsyncClient, content_type: str = FAST, **body: Any
) -> dict[str, Any]:
    response = await client.post(
        "/v1/recommend", content=json.dumps(body), headers={"content-type": content_type}
    )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _items(answer: dict[str, Any]) -> list[Any]:
    return [item["item_id"] for item in answer["items"]]


async def _stored(client: httpx.AsyncClient) -> list[dict[str, str]]:
    store = client.app.state.gateway.store  # type: ignore[attr-defined]
    return [fields for _, fields in await store.read_stream("feedback")]


# -- the maps -------------------------------------------------------------------------------


def test_a_string_map_knows_its_strings_and_nothing_else() -> None:
    ids = IdMap.of(["a", "é" * MAX_ID_LENGTH, "42"])
    assert ids.to_internal(["a", "é" * MAX_ID_LENGTH, "42", "b", 42, 1]).tolist() == [
        1,
        2,
        3,
        UNKNOWN,
        UNKNOWN,  # no coercion: the number 42 is not the string "42"
        UNKNOWN,
    ]
    assert [ids.one(v) for v in ("42", 42, "zz")] == [3, UNKNOWN, UNKNOWN]
    assert ids.to_external(np.array([3, 1])) == ["42", "a"]
    assert ids.to_internal([]).tolist() == []


def test_an_integer_map_is_the_identity_and_knows_no_string() -> None:
    ids = IdMap.identity()
    assert ids.to_internal([7, "7", 0, 2**62]).tolist() == [7, UNKNOWN, UNKNOWN, 2**62]
    assert [ids.one(7), ids.one("7")] == [7, UNKNOWN]
    assert ids.to_external(np.array([5, 9])) == [5, 9]
    assert all(type(i) is int for i in ids.to_external(np.array([5, 9])))


def test_without_map_files_a_release_has_integer_ids(tmp_path: Path) -> None:
    ids = ReleaseIds.load(tmp_path, np.arange(1, 5))
    assert ids.users.kind == "int" and ids.items.kind == "int"


@pytest.mark.parametrize(
    ("items", "problem"),
    [(["a", "b", "a"], "more than once"), (["a", "b"], "names 2 items")],
)
def test_a_map_that_does_not_fit_the_release_is_refused(
    tmp_path: Path, items: list[str], problem: str
) -> None:
    IdMap("str", items).save(tmp_path / ITEM_ID_MAP)
    with pytest.raises(ArtifactError, match=problem):
        ReleaseIds.load(tmp_path, np.arange(1, 4))


def test_a_release_loads_its_maps_but_not_unlisted_ones(
    exported: Path, string_export: Path, tmp_path: Path
) -> None:
    assert load_release(string_export).ids.items.kind == "str"
    assert load_release(exported).ids.items.kind == "int"
    stray = _string_ids(exported, tmp_path / "stray", listed=False)
    assert load_release(stray).ids.items.kind == "int"  # not in the manifest: not served


def test_rules_are_mapped_to_internal_ids_and_unknown_ones_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rules = Rules(
        exclude=[Exclusion(item_ids=["sku-2", "sku-gone", 2])],
        boosts=[Boost(item_ids=["sku-3"], factor=2.0)],
        pinned=[Pin(item_id="sku-1", position=0), Pin(item_id="nope", position=1)],
    )
    items = IdMap.of(["sku-1", "sku-2", "sku-3"])
    with caplog.at_level(logging.WARNING, logger="services.serving.rules"):
        mapped = rules.for_items(items, "release 7")
    assert mapped.exclude[0].item_ids == [2]
    assert mapped.boosts[0].item_ids == [3]
    assert [(p.item_id, p.position) for p in mapped.pinned] == [(1, 0)]
    [line] = [r.getMessage() for r in caplog.records]
    assert line == "rules: 3 item ids unknown to release 7 are ignored"
    integer_rules = Rules(pinned=[Pin(item_id=5, position=0)])
    assert integer_rules.for_items(IdMap.identity(), "release 1") == integer_rules


# -- /v1/recommend --------------------------------------------------------------------------


@pytest.mark.parametrize("content_type", [FAST, ROUTE])
async def test_a_string_release_answers_in_its_own_ids(
    exported: Path, strings: httpx.AsyncClient, content_type: str, fixed_time: None
) -> None:
    answer = await _recommend(strings, content_type, user_id="user-3", k=8)
    assert answer["user_id"] == "user-3"
    items = _items(answer)
    assert len(set(items)) == 8 and all(isinstance(i, str) for i in items)
    async with _client(exported) as integers:  # the same models under integer ids
        same = await _recommend(integers, content_type, user_id=3, k=8)
    assert same["user_id"] == 3 and all(type(i) is int for i in _items(same))
    assert items == [SKU.format(i) for i in _items(same)]
    assert [i["score"] for i in answer["items"]] == [i["score"] for i in same["items"]]


async def test_an_unknown_user_gets_the_cold_start_answer(
    strings: httpx.AsyncClient, fixed_time: None
) -> None:
    cold = {"stage": "retrieval", "reason": "cold_start"}
    before = _value("cascade_fallback_total", **cold)
    nobody = await _recommend(strings, user_id="nobody", k=5)
    assert _value("cascade_fallback_total", **cold) == before + 1
    assert nobody["user_id"] == "nobody"
    assert _items(nobody) == _items(await _recommend(strings, user_id="someone-else", k=5))
    # a known user is no cold start, an integer on a string release is unknown
    await _recommend(strings, user_id="user-3", k=5)
    assert _value("cascade_fallback_total", **cold) == before + 2
    number = await _recommend(strings, user_id=3, k=5)
    assert _value("cascade_fallback_total", **cold) == before + 3
    assert number["user_id"] == 3 and _items(number) == _items(nobody)


async def test_a_string_on_an_integer_release_is_an_unknown_user(
    client: httpx.AsyncClient, fixed_time: None
) -> None:
    cold = {"stage": "retrieval", "reason": "cold_start"}
    before = _value("cascade_fallback_total", **cold)
    known = await _recommend(client, user_id=3, k=5)
    assert _value("cascade_fallback_total", **cold) == before
    text = await _recommend(client, user_id="3", k=5)
    assert _value("cascade_fallback_total", **cold) == before + 1
    assert text["user_id"] == "3" and known["user_id"] == 3  # each as sent
    assert _items(text) == _items(await _recommend(client, user_id="somebody", k=5))
    assert _items(text) != _items(known)


async def test_excluded_string_ids_are_removed_and_unknown_ones_counted(
    strings: httpx.AsyncClient,
) -> None:
    first = _items(await _recommend(strings, user_id="user-3", k=5))
    before = _value("cascade_unknown_exclude_items_total")
    answer = await _recommend(
        strings, user_id="user-3", k=5, exclude=[first[0], first[1], "sku-nope", 7]
    )
    assert not {first[0], first[1]} & set(_items(answer)) and len(_items(answer)) == 5
    assert _value("cascade_unknown_exclude_items_total") == before + 2  # "sku-nope" and 7


async def test_a_string_exclude_on_an_integer_release_excludes_nothing(
    client: httpx.AsyncClient, fixed_time: None
) -> None:
    first = _items(await _recommend(client, user_id=3, k=5))
    before = _value("cascade_unknown_exclude_items_total")
    answer = await _recommend(client, user_id=3, k=5, exclude=[str(first[0])])
    assert _items(answer) == first
    assert _value("cascade_unknown_exclude_items_total") == before + 1
    excluded = await _recommend(client, user_id=3, k=5, exclude=[first[0]])
    assert first[0] not in _items(excluded)
    assert _value("cascade_unknown_exclude_items_total") == before + 1


async def test_ids_at_the_length_limit_and_in_any_script_are_served(
    strings: httpx.AsyncClient,
) -> None:
    longest = "ü" * (MAX_ID_LENGTH - 3) + "用户名"
    answer = await _recommend(strings, user_id=longest, k=3, exclude=["商品-" + "x" * 253])
    assert answer["user_id"] == longest and len(answer["items"]) == 3


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"user_id": ""}, "user_id"),
        ({"user_id": "x" * (MAX_ID_LENGTH + 1)}, "user_id"),
        ({"user_id": "ü" * (MAX_ID_LENGTH + 1)}, "user_id"),  # characters, not bytes
        ({"user_id": "u", "exclude": [""]}, "exclude"),
        ({"user_id": "u", "exclude": ["sku-1", "x" * (MAX_ID_LENGTH + 1)]}, "exclude"),
        ({"user_id": None}, "user_id"),
        ({"user_id": ["u"]}, "user_id"),
    ],
)
@pytest.mark.parametrize("content_type", [FAST, ROUTE])
async def test_an_empty_or_too_long_id_is_422_naming_the_field(
    strings: httpx.AsyncClient, payload: dict, field: str, content_type: str
) -> None:
    response = await strings.post(
        "/v1/recommend", content=json.dumps(payload), headers={"content-type": content_type}
    )
    assert response.status_code == 422
    assert any(field in map(str, error["loc"]) for error in response.json()["detail"])


async def test_rules_name_items_by_the_data_sets_ids(
    string_export: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with _client(string_export) as plain:
        first = _items(await _recommend(plain, user_id="user-3", k=5))
    pinned = next(SKU.format(n) for n in range(1, 500) if SKU.format(n) not in first)
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        f"exclude:\n  - item_ids: [{first[0]}, sku-nope]\n"
        f"pinned:\n  - item_id: {pinned}\n    position: 0\n  - item_id: 17\n    position: 1\n"
    )
    with caplog.at_level(logging.WARNING, logger="services.serving.rules"):
        async with _client(string_export, rules_file=rules) as ruled:
            items = _items(await _recommend(ruled, user_id="user-3", k=5))
    assert items[0] == pinned and first[0] not in items
    assert "rules: 2 item ids unknown to release 1 are ignored" in caplog.messages


async def test_each_version_answers_with_its_own_map(
    strings: httpx.AsyncClient,
) -> None:
    """Production and canary may be different versions with different maps: an answer and
    the feedback about it use the map of the version that served it."""
    gateway = strings.app.state.gateway  # type: ignore[attr-defined]
    release = gateway.releases[1]
    n = len(release.ids.items)
    other = ReleaseIds(release.ids.users, IdMap("str", [f"v2-{i}" for i in range(1, n + 1)]))
    gateway.releases[2] = dataclasses.replace(release, version=2, ids=other)
    gateway.router = VersionRouter(1, canary=2, canary_percent=0.0)
    v1 = await _recommend(strings, user_id="user-3", k=5, model_version=1)
    v2 = await _recommend(strings, user_id="user-3", k=5, model_version=2)
    assert all(i.startswith("sku-") for i in _items(v1))
    assert all(i.startswith("v2-") for i in _items(v2))
    await gateway.impressions.flush()
    shown = _items(v2)[0]
    events = [
        {"user_id": "user-3", "item_id": shown, "type": "click", "request_id": v2["request_id"]},
        {"user_id": "user-3", "item_id": "sku-" + shown[3:], "type": "click"},
    ]
    response = await strings.post("/v1/feedback", json={"events": events})
    assert response.status_code == 200
    served, organic = (await _stored(strings))[-2:]
    assert (served["trust"], served["model_version"]) == ("served", "2")
    assert served["item_id"] == organic["item_id"] == shown[3:]  # the same internal id
    assert organic["trust"] == "organic"  # by production's map


# -- /v1/feedback ---------------------------------------------------------------------------


async def test_feedback_is_stored_with_internal_ids_and_unknown_ids_untrusted(
    strings: httpx.AsyncClient,
) -> None:
    answer = await _recommend(strings, user_id="user-3", k=5)
    await strings.app.state.gateway.impressions.flush()  # type: ignore[attr-defined]
    shown, request_id = _items(answer)[0], answer["request_id"]
    cold = await _recommend(strings, user_id="new-user", k=5)
    await strings.app.state.gateway.impressions.flush()  # type: ignore[attr-defined]
    events = [
        {"user_id": "user-3", "item_id": shown, "type": "click", "request_id": request_id},
        {"user_id": "user-3", "item_id": "sku-nope", "type": "click", "request_id": request_id},
        {"user_id": "user-3", "item_id": "sku-9", "type": "click"},
        {"user_id": "someone", "item_id": "sku-9", "type": "click"},
        {"user_id": "user-3", "item_id": 9, "type": "click"},
        {
            "user_id": "new-user",
            "item_id": _items(cold)[0],
            "type": "click",
            "request_id": cold["request_id"],
        },
    ]
    before = _value(
        "cascade_feedback_events_total",
        model_version="unattributed",
        type="click",
        trust="unknown_id",
    )
    response = await strings.post("/v1/feedback", json={"events": events})
    assert response.status_code == 200 and response.json()["stored"] == 6
    stored = (await _stored(strings))[-6:]
    assert [e["trust"] for e in stored] == [
        "served",
        "item_not_shown",
        "organic",
        "unknown_id",
        "unknown_id",  # the number 9 is no id of a string release
        "unknown_id",  # an unknown user's answer vouches for no one
    ]
    assert [(e["user_id"], e["item_id"]) for e in stored] == [
        ("3", shown.removeprefix("sku-")),
        ("3", "0"),
        ("3", "9"),
        ("0", "9"),
        ("3", "0"),
        ("0", _items(cold)[0].removeprefix("sku-")),
    ]
    after = _value(
        "cascade_feedback_events_total",
        model_version="unattributed",
        type="click",
        trust="unknown_id",
    )
    assert after == before + 3


async def test_a_string_id_in_feedback_to_an_integer_release_is_unknown(
    client: httpx.AsyncClient,
) -> None:
    events = [
        {"user_id": "3", "item_id": 9, "type": "click"},
        {"user_id": 3, "item_id": 9, "type": "click"},
    ]
    response = await client.post("/v1/feedback", json={"events": events})
    assert response.status_code == 200
    text, number = (await _stored(client))[-2:]
    assert (text["trust"], text["user_id"], text["item_id"]) == ("unknown_id", "0", "9")
    assert (number["trust"], number["user_id"], number["item_id"]) == ("organic", "3", "9")


@pytest.mark.parametrize(
    "event",
    [
        {"user_id": "", "item_id": "sku-1", "type": "click"},
        {"user_id": "user-1", "item_id": "x" * (MAX_ID_LENGTH + 1), "type": "click"},
    ],
)
async def test_an_empty_or_too_long_feedback_id_is_422(
    strings: httpx.AsyncClient, event: dict
) -> None:
    response = await strings.post("/v1/feedback", json={"events": [event]})
    assert response.status_code == 422
    field = "user_id" if event["user_id"] == "" else "item_id"
    assert any(field in map(str, error["loc"]) for error in response.json()["detail"])


# -- the OpenAPI document -------------------------------------------------------------------


async def test_the_openapi_document_states_the_id_types(client: httpx.AsyncClient) -> None:
    document = client.app.openapi()  # type: ignore[attr-defined]
    schemas = document["components"]["schemas"]
    expected = [
        {"type": "integer", "minimum": 0, "maximum": 9_200_000_000_000_000_000},
        {"type": "string", "minLength": 1, "maxLength": MAX_ID_LENGTH},
    ]
    user_id = schemas["RecommendRequest"]["properties"]["user_id"]
    assert user_id["anyOf"] == expected
    assert schemas["RecommendRequest"]["properties"]["exclude"]["items"]["anyOf"] == expected
    assert schemas["FeedbackEvent"]["properties"]["item_id"]["anyOf"] == expected
    answer_id = schemas["ScoredItem"]["properties"]["item_id"]["anyOf"]
    assert answer_id == [{"type": "integer"}, {"type": "string"}]
    assert "422" in document["paths"]["/v1/recommend"]["post"]["responses"]
    assert "422" in document["paths"]["/v1/feedback"]["post"]["responses"]
