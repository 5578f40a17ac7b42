"""``cascade recommend``: a list of users answered offline equals what the gateway answers the
same users at the same moment, with integer and with string ids."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest

from cli.main import main
from core.exit_codes import EXIT_USAGE
from services.api.app import create_app
from services.settings import Settings
from tests.conftest import FEEDBACK_HEADERS
from tests.unit.services.test_string_ids import _string_ids

AT = 1_700_000_000  # one request time for both sides (hour and weekday are features)
K = 10


async def _gateway_answers(root: Path, users: list[Any], monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setattr("services.serving.gateway.time.time", lambda: float(AT))
    app = create_app(Settings(artifacts=root))
    answers = {}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://g", headers=FEEDBACK_HEADERS
        ) as http:
            for user in users:
                response = await http.post("/v1/recommend", json={"user_id": user, "k": K})
                assert response.status_code == 200, response.text
                answers[user] = response.json()["items"]
    return answers


def _batch(root: Path, users_file: Path, output: Path, *extra: str) -> pd.DataFrame:
    argv = ["recommend", "--users", str(users_file), "--k", str(K), "--output", str(output)]
    assert main([*argv, "--artifacts", str(root), "--at", str(AT), *extra]) == 0
    return pd.read_parquet(output)


def _same(batch: pd.DataFrame, gateway: dict) -> None:
    assert list(dict.fromkeys(batch["user_id"].tolist())) == list(gateway)
    for user, items in gateway.items():
        mine = batch[batch["user_id"] == user].sort_values("rank")
        assert mine["rank"].tolist() == list(range(1, len(items) + 1))
        assert mine["item_id"].tolist() == [i["item_id"] for i in items], user
        assert mine["score"].tolist() == pytest.approx([i["score"] for i in items], rel=1e-5)


def test_batch_answers_equal_the_gateways_integer_ids(
    exported: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    users = [1, 2, 3, 50, 10**9]  # the last one is unknown: the cold-start answer
    pd.DataFrame({"customer": users}).to_csv(tmp_path / "users.csv", index=False)
    batch = _batch(
        exported, tmp_path / "users.csv", tmp_path / "recs.parquet", "--user-column", "customer"
    )
    assert str(batch["user_id"].dtype) == "int64" and str(batch["item_id"].dtype) == "int64"
    assert set(batch["model_version"]) == {1} and len(batch) == len(users) * K
    assert not batch["degraded"].any()
    _same(batch, asyncio.run(_gateway_answers(exported, users, monkeypatch)))


def test_batch_answers_equal_the_gateways_string_ids(
    exported: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _string_ids(exported, tmp_path / "export")
    users = ["user-3", "user-1", "user-77", "no-such-user"]
    (tmp_path / "users.jsonl").write_text("".join(json.dumps({"user_id": u}) + "\n" for u in users))
    batch = _batch(root, tmp_path / "users.jsonl", tmp_path / "out" / "recs.parquet")
    assert batch["item_id"].str.startswith("sku-").all()
    _same(batch, asyncio.run(_gateway_answers(root, users, monkeypatch)))


def test_bad_arguments_are_usage_errors_and_write_nothing(
    exported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "none"
    empty.mkdir()
    output = tmp_path / "recs.parquet"
    argv = ["recommend", "--users", str(empty), "--output", str(output)]
    assert main([*argv, "--artifacts", str(exported)]) == EXIT_USAGE
    assert "--users" in capsys.readouterr().err and not output.exists()
    pd.DataFrame({"id": [1]}).to_parquet(tmp_path / "users.parquet")
    argv = ["recommend", "--users", str(tmp_path / "users.parquet"), "--output", str(output)]
    assert main([*argv, "--artifacts", str(exported)]) != 0
    error = capsys.readouterr().err
    assert "'user_id' is missing" in error and "id" in error and not output.exists()
    (tmp_path / "gaps.csv").write_text("user_id,segment\n1,a\n,b\n2,c\n")
    argv = ["recommend", "--users", str(tmp_path / "gaps.csv"), "--output", str(output)]
    assert main([*argv, "--artifacts", str(exported)]) == EXIT_USAGE
    error = capsys.readouterr().err
    assert "gaps.csv" in error and "empty user ids" in error and not output.exists()
