"""Population shift through `cascade simulate` against a real gateway on a loopback port:
stationary traffic keeps every PSI low, a shifted population raises it (issue 11)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli.main import main
from control.simulator import NEW_USERS, Preferences, SimulationPlan, population, simulate
from pipelines.data.synthetic import make_synthetic
from services.serving.gateway import Gateway
from services.settings import Settings
from tests.conftest import EXPORTED_SIZE
from tests.integration.served_app import served_app

pytestmark = pytest.mark.integration

DATASET = EXPORTED_SIZE  # what the `exported` fixture trained on (seed 0)


@pytest.fixture(scope="module")
def gateway(exported: Path) -> Iterator[tuple[str, Gateway]]:
    # a generous model timeout: on a busy test machine a timed-out ranker call would serve
    # degraded, unscored answers, which drift does not count
    served = Gateway(Settings(artifacts=exported, triton={"timeout_ms": 5000}))
    with served_app(served.settings, served) as url:
        yield url, served


async def _run(url: str, served: Gateway, shift_at: float | None, to: str) -> dict[str, float]:
    """Empty the window, simulate 400 requests, return the PSI of each quantity."""
    dataset = make_synthetic(*DATASET, seed=0)
    for window in served.drift.windows.values():
        window.counts[:] = 0
    plan = SimulationPlan(
        url=url, rate=100, duration_s=4.0, k=10, concurrency=4, seed=5, shift_at_s=shift_at
    )
    shifted = None if shift_at is None else population(dataset, to)
    report = await simulate(plan, population(dataset, "all"), Preferences(dataset), shifted=shifted)
    assert report.errors == 0 and report.degraded == 0
    assert report.shifted == (0 if shift_at is None else 400 - int(shift_at * 100))
    stats = served.drift.snapshot()[1]
    assert stats["user_age"].samples == 400
    return {feature: value.psi for feature, value in stats.items()}


async def test_stationary_traffic_keeps_psi_low_and_a_shift_raises_it(
    gateway: tuple[str, Gateway],
) -> None:
    url, served = gateway
    stationary = await _run(url, served, None, "all")
    assert max(stationary.values()) < 0.1, stationary
    old = await _run(url, served, 1.0, "old")  # 100 requests from everyone, 300 from the old
    assert old["user_age"] > 0.25, old
    new = await _run(url, served, 0.0, "new")  # cold starts: unknown attributes
    assert sum(psi > 0.25 for psi in new.values()) >= 3, new
    served.drift.export()
    async with httpx.AsyncClient(base_url=url) as http:
        metrics = (await http.get("/metrics")).text
    assert 'cascade_drift_psi{feature="user_age",model_version="1"}' in metrics
    assert 'cascade_drift_samples{feature="ranking_score",model_version="1"} 4000.0' in metrics


def test_shift_populations() -> None:
    dataset = make_synthetic(*DATASET, seed=0)
    new = population(dataset, "new")
    assert len(new) == NEW_USERS and new.min() > dataset.users["user_id"].max()
    heavy = population(dataset, "heavy")
    activity = dataset.interactions["user_id"].value_counts()
    assert len(heavy) == len(activity) // 10
    assert activity[heavy].min() >= activity.drop(heavy).max()


async def test_a_half_given_shift_is_refused() -> None:
    dataset = make_synthetic(*DATASET, seed=0)
    users = population(dataset, "all")
    with pytest.raises(ValueError, match="needs both shift_at_s and the shifted users"):
        await simulate(SimulationPlan(shift_at_s=1.0), users, Preferences(dataset))
    with pytest.raises(ValueError, match="shifted population has no users"):
        await simulate(
            SimulationPlan(shift_at_s=1.0), users, Preferences(dataset), shifted=users[:0]
        )


def test_cli_refuses_a_half_or_late_shift(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--shift-to", "old"]) == 2
    assert "--shift-at and --shift-to go together" in capsys.readouterr().err
    assert main(["simulate", "--duration", "5", "--shift-at", "5", "--shift-to", "old"]) == 2
    assert "--shift-at must be below --duration (5), got 5" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:  # argparse refuses an unknown choice itself
        main(["simulate", "--shift-at", "1", "--shift-to", "martians"])
    assert stopped.value.code == 2
    assert "--shift-to: invalid choice: 'martians'" in capsys.readouterr().err
