"""Closed-loop rollouts (issue 10), shortened from ``bench/rollout.py``: a real Redis with
AOF, real gateways following the desired state, simulated users clicking by the synthetic
generator's latent truth, the rollout controller deciding on what the gateways logged.

Every scenario also checks every answer: HTTP 200, its model versions agree, and the
impression log holds the same version for its request id.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import rollout as loop
from control.simulator import Preferences, population
from services.state.desired_state import DesiredState, RedisDesiredState
from services.util.local_redis import start_redis_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# the bench's data and training: smaller, and shuffled item embeddings stop mattering
SIZE, TRAIN = loop.SIZE, loop.TRAIN
SHORT_DEADLINE = dataclasses.replace(loop.PLAN, step_deadline_s=6.0)


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("closed-loop") / "export"
    loop.build(root, SIZE, TRAIN)
    return root


def _redis(directory: Path) -> Iterator[str]:
    try:
        url, process = start_redis_server(directory, persist=True)
    except FileNotFoundError:
        pytest.skip("redis-server is not installed")
    desired = RedisDesiredState(url, loop.NAMESPACE)
    desired.write(DesiredState(production=loop.GOOD, revision=1), 0)
    desired.close()
    yield url
    process.terminate()
    process.wait(timeout=10)


@pytest.fixture(scope="module")
def stack(export: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[loop.Stack]:
    """One in-process gateway (models in process) on a private Redis."""
    dataset = loop.truth(SIZE, TRAIN)
    for url in _redis(tmp_path_factory.mktemp("redis")):
        with loop.serving(loop.gateway_settings(export, url)) as (gateway_url, gateway):
            yield loop.Stack(
                export,
                url,
                gateway_url,
                gateway,
                population(dataset, "all"),
                Preferences(dataset),
                rate=100.0,
            )


def _clean(result: dict) -> None:
    answers = {k: result[k] for k in ("statuses", "transport_errors", "degraded", "served")}
    assert result["non_200"] == 0, answers
    assert result["mixed_versions"] == 0
    assert result["feedback_non_200"] == 0
    assert result["answers"] > 0


async def test_a_worse_candidate_is_rolled_back_before_half_the_traffic(
    stack: loop.Stack,
) -> None:
    result = await loop.rollout(stack, loop.GOOD, loop.BAD, force=True)
    _clean(result)
    assert result["forced"]
    assert result["outcome"] == "rolled_back"
    assert result["reason"] == "kpi_worse", result["decisions"]
    assert result["max_weight"] < 0.5
    assert result["arms"]["canary"]["ctr"] < result["arms"]["control"]["ctr"]
    assert result["served"].keys() == {str(loop.GOOD), str(loop.BAD)}


async def test_a_canary_without_traffic_is_held_then_rolled_back_at_the_deadline(
    stack: loop.Stack,
) -> None:
    result = await loop.rollout(stack, loop.GOOD, loop.TWIN, rate=1.0, plan=SHORT_DEADLINE)
    _clean(result)
    assert result["outcome"] == "rolled_back"
    # answers came, too few to decide: inconclusive; no_traffic only without any answer
    answered = result["arms"].get("canary", {}).get("requests", 0) > 0
    assert result["reason"] == ("inconclusive" if answered else "no_traffic")
    assert {d.get("outcome") for d in result["decisions"] if "looks" in d} == {"hold"}
    assert result["time_to_decision_s"] >= SHORT_DEADLINE.step_deadline_s


async def test_a_rolled_back_canary_stays_loaded_for_the_requests_on_it(
    stack: loop.Stack,
) -> None:
    """Rolled back, the canary leaves the routing at once but its models stay for the
    follower's grace (``retire_after_s``): a request routed to it just before finishes."""
    gateway = stack.gateway
    await loop.wait_applied(gateway, loop.reset(stack, loop.GOOD))
    desired = RedisDesiredState(stack.redis_url, loop.NAMESPACE)
    current = desired.read()
    assert current is not None
    state = desired.write(current.next(canary=loop.TWIN, canary_weight=0.5), current.revision)
    await loop.wait_applied(gateway, state)
    assert gateway.router is not None and gateway.router.canary == loop.TWIN
    state = desired.write(state.next(canary=None, canary_weight=0.0), state.revision)
    await loop.wait_applied(gateway, state)
    desired.close()
    assert gateway.router.canary is None
    assert loop.TWIN in gateway.backend.ranker  # type: ignore[attr-defined]  # LocalBackend
    assert loop.TWIN in gateway.releases


async def test_a_candidate_triton_cannot_load_is_aborted_and_production_keeps_serving(
    export: Path, tmp_path: Path
) -> None:
    from services.inference.triton_server import TritonUnavailable, wheel_directory

    try:
        wheel_directory()
    except TritonUnavailable as error:
        pytest.skip(f"Triton cannot run here: {error}")
    dataset = loop.truth(SIZE, TRAIN)
    for url in _redis(tmp_path):  # its own Redis: no other gateway follows this one's state
        base = loop.Stack(
            export, url, "", None, population(dataset, "all"), Preferences(dataset), 60.0
        )
        async with loop.on_triton(base, tmp_path) as on_triton:
            result = await loop.rollout(on_triton, loop.GOOD, loop.TWIN)
    _clean(result)
    assert result["outcome"] == "rolled_back"
    assert result["served"].keys() == {str(loop.GOOD)}  # the canary was never routed
    assert not result["gateway"]["canary_routed"]
    assert result["gateway"]["canary_failed"] == [loop.TWIN]
    assert "dlrm_dense.onnx is corrupted" in " ".join(result["gateway"]["problems"])
    assert result["reason"] == "canary_load_failed"  # no verdict while the replica loads
