"""`cascade catalog update` on a serving embedded stack (issue 33): the new version goes live
the documented way (`cascade rollout V --once`, `cascade promote`) while requests keep
coming; every answer is a 200, and the new item is served after the switch."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import httpx
import pandas as pd
import pytest

from cli.main import main
from services.api.app import create_app
from services.serving.gateway import Gateway
from services.settings import FollowSettings, Settings
from tests.conftest import FEEDBACK_HEADERS

pytestmark = pytest.mark.integration

NEW_SKU = 10_001
USERS = range(1, 41)


async def _answer(http: httpx.AsyncClient, user: int) -> tuple[int, int | None, bool]:
    """Status, release version and whether the new item is in the answer."""
    response = await http.post("/v1/recommend", json={"user_id": user, "k": 500})
    if response.status_code != 200:
        return response.status_code, None, False
    body = response.json()
    return 200, body["model_versions"]["release"], NEW_SKU in {i["item_id"] for i in body["items"]}


async def test_a_catalog_update_goes_live_under_load(
    exported: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CASCADE_REDIS__URL", raising=False)  # the embedded stack's files
    root = tmp_path / "export"
    shutil.copytree(exported, root, ignore=shutil.ignore_patterns("work"))
    items = pd.read_parquet(root / "releases" / "1" / "online" / "items.parquet")
    update = items.iloc[:1][["item_id", "year", "genres"]].copy()
    update.loc[:, "item_id"] = NEW_SKU
    path = tmp_path / "items.parquet"
    update.to_parquet(path, index=False)

    # every item is a candidate (a flat index over the whole catalog), so the new item is in
    # every answer of k=500 once its version serves
    settings = Settings(
        artifacts=root, candidates=1000, follow=FollowSettings(interval_s=0.1, retire_after_s=0)
    )
    gateway = Gateway(settings)
    app = create_app(gateway=gateway)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=transport, base_url="http://g", headers=FEEDBACK_HEADERS
        ) as http,
    ):
        before = [await _answer(http, u) for u in USERS]
        assert {(code, version, new) for code, version, new in before} == {(200, 1, False)}

        assert (
            await asyncio.to_thread(
                main, ["catalog", "update", str(path), "--artifacts", str(root)]
            )
            == 0
        )

        switched = asyncio.Event()
        answers: list[tuple[int, int | None, bool]] = []

        async def client(offset: int) -> None:
            """50 requests, and on until 10 after the switch (the switch is in the middle)."""
            i, after_switch = 0, 0
            while (i < 50 or after_switch < 10) and i < 1000:
                answers.append(await _answer(http, USERS[(offset + i) % len(USERS)]))
                i, after_switch = i + 1, after_switch + switched.is_set()
                await asyncio.sleep(0.005)

        async def go_live() -> None:
            argv = ["--artifacts", str(root)]
            assert await asyncio.to_thread(main, ["rollout", "2", "--once", *argv]) == 0
            assert await asyncio.to_thread(main, ["promote", *argv]) == 0
            deadline = time.monotonic() + 30
            while gateway.router is None or gateway.router.default != 2:
                assert time.monotonic() < deadline, "the gateway did not switch to version 2"
                await asyncio.sleep(0.05)
            switched.set()

        await asyncio.gather(go_live(), *(client(k * 10) for k in range(4)))
        assert switched.is_set()
        assert len(answers) >= 200
        assert {version for _, version, _ in answers} == {1, 2}
        assert {code for code, _, _ in answers} == {200}
        assert all(new == (version == 2) for _, version, new in answers)

        after = [await _answer(http, u) for u in USERS]
        assert {(code, version, new) for code, version, new in after} == {(200, 2, True)}
