"""`cascade simulate` against a real gateway on a loopback port: bounded, self-stopping,
clicks attributed to the version that served them (issue 9)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from cli.main import main
from control.simulator import Preferences, SimulationPlan, population, position_bias, simulate
from pipelines.data.synthetic import make_synthetic
from services.serving.gateway import Gateway
from services.settings import Settings
from services.util.local_redis import free_port
from tests.conftest import EXPORTED_SIZE
from tests.integration.served_app import served_app

pytestmark = pytest.mark.integration

DATASET = EXPORTED_SIZE  # what the `exported` fixture trained on (seed 0)


@pytest.fixture(scope="module")
def gateway(exported: Path) -> Iterator[tuple[str, Gateway]]:
    # a generous model timeout: a busy test machine must not turn answers degraded
    settings = Settings(artifacts=exported, triton={"timeout_ms": 5000})
    served = Gateway(settings)
    with served_app(settings, served) as url:
        yield url, served


def test_ground_truth_prefers_what_the_generator_rated_high() -> None:
    dataset = make_synthetic(*DATASET, seed=0)
    prefs = Preferences(dataset)
    rows = dataset.interactions
    high = rows[rows["rating"] >= 5].head(200)
    low = rows[rows["rating"] <= 1].head(200)

    def relevance(rows: object) -> float:
        pairs = zip(rows.user_id, rows.item_id, strict=True)  # type: ignore[attr-defined]
        return float(np.mean([prefs.relevance(int(u), np.array([i]))[0] for u, i in pairs]))

    rel_high, rel_low = relevance(high), relevance(low)
    assert np.mean(rel_high) > 2 * np.mean(rel_low)
    assert np.all(np.diff(position_bias(10)) < 0)  # a lower rank is seen less


def test_populations_shift_the_users() -> None:
    dataset = make_synthetic(*DATASET, seed=0)
    ages = dataset.users.set_index("user_id")["age"]
    assert ages[population(dataset, "old")].min() >= 50
    assert ages[population(dataset, "young")].max() < 30
    assert len(population(dataset, "all")) == DATASET[0]
    with pytest.raises(ValueError, match="unknown population"):
        population(dataset, "martians")


async def test_simulated_traffic_is_bounded_and_attributed(
    gateway: tuple[str, Gateway],
) -> None:
    url, served = gateway
    dataset = make_synthetic(*DATASET, seed=0)
    plan = SimulationPlan(url=url, rate=40, duration_s=2.0, k=10, seed=3)
    started = time.monotonic()
    report = await simulate(plan, population(dataset, "all"), Preferences(dataset))
    assert time.monotonic() - started < 30  # stops by itself
    assert report.errors == 0 and set(report.per_version) == {1}
    tally = report.per_version[1]
    assert tally.requests == 80 and tally.impressions == 800
    assert tally.clicks > 0 and tally.hits <= tally.requests
    assert served.impressions is not None
    await served.impressions.flush()
    clicks = [f for _, f in await served.store.read_stream("feedback") if f.get("request_id")]
    assert len(clicks) >= tally.clicks  # every click stored (the module shares one store)
    assert {f["model_version"] for f in clicks} == {"1"}  # attributed by the server
    logged = {f["request_id"] for _, f in await served.store.read_stream("impressions")}
    assert {f["request_id"] for f in clicks} <= logged


def test_cli_prints_a_table_and_json(
    gateway: tuple[str, Gateway], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = gateway
    size = [str(n) for n in DATASET]
    code = main(
        [
            "simulate",
            "--url",
            url,
            "--rate",
            "20",
            "--duration",
            "1",
            "--dataset",
            "synthetic",
            "--users",
            size[0],
            "--items",
            size[1],
            "--interactions",
            size[2],
        ]
    )
    out = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(out[-1])
    assert code == 0 and summary["degraded"] == 0 and summary["errors"] == 0
    assert summary["error_kinds"] == {}
    assert any(line.split()[:2] == ["1", "20"] for line in out)  # version 1: 20 requests


def test_cli_refuses_a_bad_option_and_an_absent_gateway(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stopped:  # a usage error: argparse says so
        main(["simulate", "--rate", "0"])
    assert stopped.value.code == 2
    assert "argument --rate: must be a finite number > 0, got '0'" in capsys.readouterr().err
    dead = f"http://127.0.0.1:{free_port()}"
    assert main(["simulate", "--url", dead, "--rate", "5", "--duration", "0.5"]) == 3
    assert "is `cascade serve` running?" in capsys.readouterr().err
