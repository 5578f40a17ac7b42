"""The README's "Your own data" walkthrough on the shipped shop sample (examples/shop), end to
end: train from the dataset file, serve, ask with a string customer id, post feedback with a
string SKU, and answer the same customers offline with ``cascade recommend``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pandas as pd
import pytest

from cli.main import main
from services.settings import Settings
from tests.conftest import EXPORTED_TRAINING, app_client

pytestmark = pytest.mark.integration

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "shop" / "dataset.yaml"
AT = 1_767_300_000  # one request time for the gateway and the batch (time is a feature)


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample trained briefly through `cascade train --data`; the export root."""
    root = tmp_path_factory.mktemp("shop")
    options = [f"--{k.replace('_', '-')}={v}" for k, v in EXPORTED_TRAINING.items()]
    argv = ["train", "--data", str(SAMPLE), "--workdir", str(root / "work")]
    assert main([*argv, "--output", str(root), *options]) == 0
    return root


@pytest.fixture
async def gateway(shop: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[httpx.AsyncClient]:
    monkeypatch.setattr("services.serving.gateway.time.time", lambda: float(AT))
    async with app_client(Settings(artifacts=shop)) as http:
        yield http


def _customers(count: int) -> list[str]:
    events = pd.read_json(SAMPLE.parent / "events.jsonl.gz", lines=True, nrows=5_000)
    return list(dict.fromkeys(events["customer"].tolist()))[:count]


async def test_a_customer_gets_skus_and_their_click_is_vouched_for(
    gateway: httpx.AsyncClient,
) -> None:
    customer = _customers(1)[0]
    answer = await gateway.post("/v1/recommend", json={"user_id": customer, "k": 5})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    skus = [item["item_id"] for item in body["items"]]
    assert body["user_id"] == customer and len(skus) == 5
    assert all(isinstance(sku, str) and sku.startswith("SKU-") for sku in skus)
    assert not body["degraded"]

    click = {"request_id": body["request_id"], "user_id": customer, "item_id": skus[0]}
    response = await gateway.post("/v1/feedback", json={"events": [{**click, "type": "click"}]})
    assert response.status_code == 200 and response.json()["stored"] == 1, response.text
    stored = await gateway.app.state.gateway.store.read_stream("feedback")  # type: ignore[attr-defined]
    assert stored[-1][1]["trust"] == "served"

    stranger = await gateway.post("/v1/recommend", json={"user_id": "cu_nobody", "k": 5})
    assert stranger.status_code == 200 and len(stranger.json()["items"]) == 5  # cold start


async def test_unavailable_skus_are_never_answered(gateway: httpx.AsyncClient) -> None:
    items = pd.read_csv(SAMPLE.parent / "items.csv")
    unavailable = set(items.loc[~items["available"], "sku"])
    assert unavailable
    answered: set[str] = set()
    for customer in [*_customers(10), "cu_nobody"]:
        answer = await gateway.post("/v1/recommend", json={"user_id": customer, "k": 200})
        answered |= {item["item_id"] for item in answer.json()["items"]}
    assert len(answered) > 200 and not answered & unavailable


async def test_offline_answers_equal_the_gateways(
    shop: Path, gateway: httpx.AsyncClient, tmp_path: Path
) -> None:
    customers = _customers(4)
    online = {}
    for customer in customers:
        answer = await gateway.post("/v1/recommend", json={"user_id": customer, "k": 10})
        online[customer] = [item["item_id"] for item in answer.json()["items"]]
    pd.DataFrame({"customer": customers}).to_parquet(tmp_path / "customers.parquet")
    argv = ["recommend", "--users", str(tmp_path / "customers.parquet"), "--k", "10"]
    argv += ["--user-column", "customer", "--output", str(tmp_path / "recs.parquet")]
    code = await asyncio.to_thread(main, [*argv, "--artifacts", str(shop), "--at", str(AT)])
    assert code == 0
    batch = pd.read_parquet(tmp_path / "recs.parquet")
    ranked = batch.sort_values(["user_id", "rank"])
    offline = {c: ranked[ranked["user_id"] == c]["item_id"].tolist() for c in customers}
    assert offline == online
