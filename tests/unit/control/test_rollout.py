"""The rollout controller on simulated streams (in-memory store, file registry, file desired
state): every outcome, resumption, refusals and manual actions (issue 10)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from control.registry import FileRegistry, VersionState
from control.rollout.analysis import AnalysisConfig
from control.rollout.controller import RolloutController, RolloutPlan, RolloutRefused
from control.rollout.state import FileRolloutLog
from services.state.desired_state import FileDesiredState
from services.stores.memory import InMemoryStore
from tests.unit.control.fake_exports import FAIL, make_version, production_and_candidate

ANALYSIS = AnalysisConfig(min_impressions=500, min_requests=50, non_inferiority_margin=0.3)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    return production_and_candidate(tmp_path / "artifacts")


def _controller(
    artifacts: Path, store: InMemoryStore, clock: Clock, **plan: object
) -> RolloutController:
    options: dict = {
        "min_step_s": 10,
        "interval_s": 1,
        "step_deadline_s": 100,
        "analysis": ANALYSIS,
    }
    options.update(plan)
    return RolloutController(
        artifacts,
        FileRegistry(artifacts / "registry.json"),
        FileDesiredState(artifacts / "rollout" / "desired.json"),
        FileRolloutLog(artifacts / "rollout"),
        store,
        RolloutPlan(**options),
        clock=clock,
    )


async def _traffic(
    store: InMemoryStore,
    rng: np.random.Generator,
    weight: float,
    ctr: dict[int, float],
    answers: int = 400,
    reasons: dict[int, str] | None = None,
    split: str | None = None,
) -> None:
    """``answers`` impression sets of 10 items split by ``weight`` (version 2 = canary), and
    clicks drawn with each version's CTR, as the gateway logs them; ``split``: the split the
    answers name (by default the one of ``weight``; ``""`` as for a requested version)."""
    if split is None:
        split = f"2:{weight:g}" if weight > 0 else ""
    impressions, clicks = [], []
    for number in range(answers):
        version = 2 if rng.random() < weight else 1
        request_id = f"{rng.integers(2**62):032x}"[-32:]
        impressions.append(
            {
                "request_id": request_id,
                "user_id": str(number),
                "model_version": str(version),
                "split": split,
                "items": " ".join(str(i) for i in range(10)),
                "scores": "1 " * 10,
                "degraded": "0",
                "reasons": (reasons or {}).get(version, ""),
                "latency_ms": "5.0",
                "timestamp": "0",
            }
        )
        shown = rng.random(10) < ctr[version]
        for rank, click in enumerate(shown):
            if click:
                clicks.append(
                    {
                        "user_id": str(number),
                        "item_id": str(rank),
                        "type": "click",
                        "model_version": str(version),
                        "request_id": request_id,
                        "hit": "1" if rank == int(np.argmax(shown)) else "0",
                        "trust": "served",
                    }
                )
    await store.append_impressions(impressions, max_len=10**7, ttl_s=60)
    if clicks:
        await store.append_feedback(clicks, max_len=10**7, idempotency_ttl_s=60)


async def test_a_worse_canary_is_rolled_back_before_half_the_traffic(artifacts: Path) -> None:
    store, clock, rng = InMemoryStore(), Clock(), np.random.default_rng(0)
    controller = _controller(artifacts, store, clock)
    record = controller.start(2)
    desired = controller.desired.read()
    assert desired is not None and (desired.canary, desired.canary_weight) == (2, 0.05)
    for _ in range(60):
        await _traffic(store, rng, record.weight, {1: 0.10, 2: 0.03})
        clock.now += 2
        record = await controller.look()  # type: ignore[assignment]
        if record.status != "running":
            break
    assert record.status == "rolled_back" and record.reason == "kpi_worse"
    assert max(record.weights[: record.step + 1]) < 0.5
    desired = controller.desired.read()
    assert desired is not None and desired.production == 1 and desired.canary is None
    assert controller.registry.get(2).state == VersionState.RETIRED  # type: ignore[union-attr]
    events = [entry["event"] for entry in controller.log.audit(1000)]
    assert events[0] == "started" and events[-1] == "rolled_back" and "look" in events


async def test_a_good_canary_walks_every_step_and_is_promoted(artifacts: Path) -> None:
    store, clock, rng = InMemoryStore(), Clock(), np.random.default_rng(1)
    controller = _controller(artifacts, store, clock)
    record = controller.start(2)
    weights_seen = []
    for _ in range(200):
        await _traffic(store, rng, record.weight, {1: 0.05, 2: 0.08}, answers=600)
        clock.now += 5
        record = await controller.look()  # type: ignore[assignment]
        weights_seen.append(record.weight)
        if record.status != "running":
            break
    assert record.status == "promoted", record.last_decision
    assert sorted(set(weights_seen)) == [0.05, 0.25, 0.5]
    desired = controller.desired.read()
    assert desired is not None and desired.production == 2 and desired.canary is None
    assert controller.registry.production() == 2
    assert controller.registry.previous_production() == 1
    decision = record.last_decision
    assert decision is not None and decision["outcome"] == "pass"
    assert {"ctr_cs_lower", "ctr_always_valid_p", "srm_p"} <= set(decision["values"])


async def test_no_traffic_holds_then_rolls_back_at_the_deadline(artifacts: Path) -> None:
    store, clock = InMemoryStore(), Clock()
    controller = _controller(artifacts, store, clock)
    controller.start(2)
    record = await controller.look()
    assert record is not None and record.status == "running"
    assert record.last_decision is not None and record.last_decision["outcome"] == "hold"
    clock.now += 101
    record = await controller.look()
    assert record is not None and record.status == "rolled_back" and record.reason == "no_traffic"


async def test_a_guardrail_breach_rolls_back_at_once(artifacts: Path) -> None:
    store, clock, rng = InMemoryStore(), Clock(), np.random.default_rng(2)
    controller = _controller(artifacts, store, clock, weights=(0.5,))
    controller.start(2)
    await _traffic(store, rng, 0.5, {1: 0.05, 2: 0.05}, answers=400, reasons={2: "scoring:error"})
    record = await controller.look()
    assert record is not None and record.status == "rolled_back"
    assert record.reason == "error_rate"


async def test_a_sample_ratio_mismatch_rolls_back(artifacts: Path) -> None:
    store, clock, rng = InMemoryStore(), Clock(), np.random.default_rng(3)
    controller = _controller(artifacts, store, clock, weights=(0.5,))
    controller.start(2)
    # the gateway's split says 0.5 yet sends a fifth of its users to the canary
    await _traffic(store, rng, 0.2, {1: 0.05, 2: 0.05}, answers=2000, split="2:0.5")
    record = await controller.look()
    assert record is not None and record.status == "rolled_back" and record.reason == "srm"
    detail = controller.log.audit(5)[-1]["detail"]  # what the log line and audit show
    assert "srm: canary " in detail and " of 2000 requests, configured weight 0.5" in detail


async def test_a_restarted_controller_resumes_without_counting_twice(artifacts: Path) -> None:
    store, clock, rng = InMemoryStore(), Clock(), np.random.default_rng(4)
    first = _controller(artifacts, store, clock)
    first.start(2)
    await _traffic(store, rng, 0.05, {1: 0.05, 2: 0.05}, answers=300)
    before = await first.look()
    assert before is not None
    second = _controller(artifacts, store, clock)  # the first one was killed
    resumed = second.start(2)
    assert resumed.id == before.id and resumed.cursors == before.cursors
    after = await second.look()
    assert after is not None
    assert after.arms["control"].requests == before.arms["control"].requests
    assert after.looks == before.looks + 1


async def test_a_replica_that_cannot_load_the_canary_aborts_it(artifacts: Path) -> None:
    store, clock = InMemoryStore(), Clock()
    controller = _controller(artifacts, store, clock)
    controller.start(2)
    controller.desired.report(
        "gw-1",
        {"replica": "gw-1", "canary_failed": 2, "problems": ["canary 2 cannot be loaded: boom"]},
        60,
    )
    record = await controller.look()
    assert record is not None and record.status == "rolled_back"
    assert record.reason == "canary_load_failed"
    desired = controller.desired.read()
    assert desired is not None and desired.production == 1 and desired.canary is None


async def test_a_version_deleted_mid_rollout_aborts(artifacts: Path) -> None:
    store, clock = InMemoryStore(), Clock()
    controller = _controller(artifacts, store, clock)
    controller.start(2)
    shutil.rmtree(artifacts / "releases" / "2")
    record = await controller.look()
    assert record is not None and (record.status, record.reason) == (
        "rolled_back",
        "artifact_missing",
    )
    audit = controller.log.audit(5)
    assert "releases/2 is gone" in audit[-1]["detail"]


class _Unreachable(InMemoryStore):
    async def read_stream(self, name: str, after: str = "0-0", count: int = 10_000) -> list:
        raise ConnectionError("redis is away")


async def test_unreadable_streams_pause_and_never_act(artifacts: Path) -> None:
    clock = Clock()
    controller = _controller(artifacts, _Unreachable(), clock)
    controller.start(2)
    clock.now += 1000  # far past the deadline: an unpaused controller would roll back
    record = await controller.look()
    assert record is not None and record.status == "running" and record.looks == 0
    assert controller.paused


def test_refusals(artifacts: Path) -> None:
    store, clock = InMemoryStore(), Clock()
    registry = FileRegistry(artifacts / "registry.json")
    make_version(artifacts, 3)
    registry.register(3, FAIL)
    controller = _controller(artifacts, store, clock)
    with pytest.raises(RolloutRefused, match="rejected by the gate"):
        controller.start(3)
    with pytest.raises(RolloutRefused, match="no complete export"):
        controller.start(9)
    with pytest.raises(RolloutRefused, match="is production"):
        controller.start(1)
    record = controller.start(3, force=True)
    assert record.forced and registry.get(3).state == VersionState.CANARY  # type: ignore[union-attr]
    controller.rollback("next case")
    make_version(artifacts, 4)  # never validated at all
    assert controller.start(4, force=True).forced
    assert registry.get(4).verdict["failed_checks"] == ["never validated"]  # type: ignore[union-attr]
    with pytest.raises(RolloutRefused, match="rollout of version 4 is still running"):
        controller.start(2)
    with pytest.raises(RolloutRefused, match="weights must lie in"):
        RolloutPlan(weights=(0.5, 1.0))


async def test_manual_promote_then_rollback_restores_the_previous_production(
    artifacts: Path,
) -> None:
    store, clock = InMemoryStore(), Clock()
    controller = _controller(artifacts, store, clock)
    controller.start(2)
    assert controller.promote("looks fine").status == "promoted"
    assert controller.registry.production() == 2
    controller.rollback("oops")  # no rollout running: undo the promotion
    desired = controller.desired.read()
    assert desired is not None and desired.production == 1 and desired.canary is None
    assert controller.registry.production() == 1
    with pytest.raises(RolloutRefused, match="nothing to promote"):
        controller.promote()


async def test_no_verdict_while_a_replica_is_still_loading_the_step(artifacts: Path) -> None:
    store, clock, rng = InMemoryStore(), Clock(), np.random.default_rng(5)
    controller = _controller(artifacts, store, clock, weights=(0.5,))
    controller.start(2)
    revision = controller.desired.read().revision  # type: ignore[union-attr]
    controller.desired.report("gw-1", {"replica": "gw-1", "applied_revision": revision - 1}, 60)
    await _traffic(store, rng, 0.0, {1: 0.05, 2: 0.05}, answers=2000)  # all on production
    record = await controller.look()
    assert record is not None and record.status == "running" and record.looks == 0  # no SRM
    controller.desired.report(
        "gw-1", {"replica": "gw-1", "canary_failed": 2, "applied_revision": revision}, 60
    )
    record = await controller.look()
    assert record is not None and record.reason == "canary_load_failed"


async def test_loading_past_the_step_deadline_still_gets_no_verdict_until_the_apply_deadline(
    artifacts: Path,
) -> None:
    """A slow canary load (a busy machine) is not judged on the traffic it never got: no
    sample-ratio verdict after the step deadline; past the apply deadline the rollout ends
    with the reason that says what happened."""
    store, clock, rng = InMemoryStore(), Clock(), np.random.default_rng(7)
    controller = _controller(artifacts, store, clock, weights=(0.5,), apply_deadline_s=300)
    controller.start(2)
    revision = controller.desired.read().revision  # type: ignore[union-attr]
    controller.desired.report("gw-1", {"replica": "gw-1", "applied_revision": revision - 1}, 600)
    await _traffic(store, rng, 0.0, {1: 0.05, 2: 0.05}, answers=2000)  # all on production
    clock.now += 150  # past the step deadline (100 s), within the apply deadline
    record = await controller.look()
    assert record is not None and record.status == "running" and record.looks == 0
    clock.now += 151
    record = await controller.look()
    assert record is not None and record.status == "rolled_back"
    assert record.reason == "not_applied"
    audit = controller.log.audit(5)
    assert "['gw-1'] did not apply step 0 in 301 s" in audit[-1]["detail"]


async def test_the_step_times_count_from_when_the_replicas_applied_it(artifacts: Path) -> None:
    store, clock = InMemoryStore(), Clock()
    controller = _controller(artifacts, store, clock, weights=(0.5,))
    controller.start(2)
    revision = controller.desired.read().revision  # type: ignore[union-attr]
    controller.desired.report("gw-1", {"replica": "gw-1", "applied_revision": revision - 1}, 600)
    clock.now += 90  # loading for 90 s of the 100 s step deadline
    assert (await controller.look()).status == "running"  # type: ignore[union-attr]
    controller.desired.report("gw-1", {"replica": "gw-1", "applied_revision": revision}, 600)
    clock.now += 20  # 110 s after the step began: the look that sees it applied
    record = await controller.look()
    assert record is not None and record.status == "running"
    clock.now += 99  # 99 s of the step deadline under the step's routing: still in time
    record = await controller.look()
    assert record is not None and record.status == "running"
    clock.now += 2
    record = await controller.look()
    assert record is not None and record.reason == "no_traffic"


async def test_traffic_served_while_replicas_apply_is_kept_out_of_the_split_test(
    artifacts: Path,
) -> None:
    store, clock, rng = InMemoryStore(), Clock(), np.random.default_rng(6)
    controller = _controller(artifacts, store, clock, weights=(0.5,))
    controller.start(2)
    revision = controller.desired.read().revision  # type: ignore[union-attr]
    controller.desired.report("gw-1", {"replica": "gw-1", "applied_revision": revision - 1}, 60)
    await _traffic(store, rng, 0.0, {1: 0.05, 2: 0.05}, answers=2000)  # loading: all production
    record = await controller.look()
    assert record is not None and record.looks == 0
    controller.desired.report("gw-1", {"replica": "gw-1", "applied_revision": revision}, 60)
    await _traffic(store, rng, 0.5, {1: 0.05, 2: 0.05}, answers=2000)
    record = await controller.look()
    assert record is not None and record.reason != "srm"  # (it even passed: promoted)
    assert list(record.splits) == ["0.5"]
    assert record.splits["0.5"].control + record.splits["0.5"].canary == 2000
    decision = record.last_decision
    assert decision is not None and decision["reason"] != "srm"
    assert decision["values"]["requests_control"] > 2000  # the KPI still sees all traffic


async def test_answers_not_assigned_by_the_split_never_count_against_it_whenever_they_are_read(
    artifacts: Path,
) -> None:
    """The first look may come after the replica applied the step, with the answers it gave
    while loading (all production) not read yet, or written to the stream late: they name no
    split and stay out of the sample-ratio test, as do answers of a version the client
    requested. (Windows of time told them apart before, and halted healthy rollouts.)"""
    store, clock, rng = InMemoryStore(), Clock(), np.random.default_rng(8)
    controller = _controller(artifacts, store, clock, weights=(0.5,))
    controller.start(2)
    revision = controller.desired.read().revision  # type: ignore[union-attr]
    controller.desired.report("gw-1", {"replica": "gw-1", "applied_revision": revision}, 60)
    await _traffic(store, rng, 0.5, {1: 0.05, 2: 0.05}, answers=300)
    await _traffic(store, rng, 0.0, {1: 0.05, 2: 0.05}, answers=600)  # loading, written late
    await _traffic(store, rng, 1.0, {1: 0.05, 2: 0.05}, answers=100, split="")  # requested 2
    record = await controller.look()
    assert record is not None and record.looks == 1 and record.status == "running"
    decision = record.last_decision
    assert decision is not None and decision["outcome"] != "halt", decision
    assert decision["values"]["srm_expected_canary"] == 150
    assert decision["values"]["requests_control"] > 600  # the KPI sees every answer


async def test_each_rollout_salts_its_user_assignment_and_keeps_it_across_steps(
    artifacts: Path,
) -> None:
    store, clock, rng = InMemoryStore(), Clock(), np.random.default_rng(5)
    controller = _controller(artifacts, store, clock)
    record = controller.start(2)
    desired = controller.desired.read()
    assert desired is not None and desired.assignment_salt == record.id
    for _ in range(200):
        await _traffic(store, rng, record.weight, {1: 0.05, 2: 0.08}, answers=600)
        clock.now += 5
        record = await controller.look()  # type: ignore[assignment]
        current = controller.desired.read()
        assert current is not None and current.assignment_salt == record.id
        if record.step > 0:
            break
    assert record.step > 0, record.last_decision


async def _forged_flood(store: InMemoryStore, rng: np.random.Generator, clicks: int) -> None:
    """Clicks for the canary as an attacker's would be stored: organic or untrusted (the
    gateway never gives them a version), and in the form gateways before trust levels
    stored a client's claim (``model_version`` 2, a hit, no ``trust``)."""
    forged = [
        {
            "user_id": str(int(rng.integers(1000))),
            "item_id": str(int(rng.integers(10))),
            "type": "click",
            **[
                {"model_version": "", "trust": "organic"},
                {"model_version": "", "trust": "user_mismatch", "request_id": "f" * 32},
                {"model_version": "2", "hit": "1"},
            ][n % 3],
        }
        for n in range(clicks)
    ]
    await store.append_feedback(forged, max_len=10**7, idempotency_ttl_s=60)


async def _worse_canary(root: Path, flood: bool) -> tuple:
    """A worse canary's rollout, optionally with 10x its real clicks forged in its favour:
    (status, reason, looks, the canary's counted clicks and hits)."""
    store, clock, rng = InMemoryStore(), Clock(), np.random.default_rng(0)
    forger = np.random.default_rng(1)
    controller = _controller(root, store, clock)
    record = controller.start(2)
    for _ in range(60):
        await _traffic(store, rng, record.weight, {1: 0.10, 2: 0.03})
        if flood:
            await _forged_flood(store, forger, 10 * 40)  # ~10x the ~40 real clicks a round
        clock.now += 2
        record = await controller.look()  # type: ignore[assignment]
        if record.status != "running":
            break
    canary = record.arm("canary")
    return record.status, record.reason, record.looks, canary.clicks, canary.hits


async def test_forged_clicks_do_not_change_a_canarys_decision(
    artifacts: Path, tmp_path: Path
) -> None:
    """The analysis counts only clicks the gateway vouched for: the same decision, after
    the same looks, on the same counts, with and without the flood."""
    for name in ("quiet", "flooded"):
        shutil.copytree(artifacts, tmp_path / name)
    quiet = await _worse_canary(tmp_path / "quiet", flood=False)
    flooded = await _worse_canary(tmp_path / "flooded", flood=True)
    assert quiet[:2] == ("rolled_back", "kpi_worse")
    assert flooded == quiet


async def test_with_cuped_the_controller_adjusts_by_the_users_ctr_before_the_start(
    artifacts: Path,
) -> None:
    store, rng = InMemoryStore(), np.random.default_rng(11)
    await _traffic(store, rng, 0.0, {1: 0.05, 2: 0.05}, answers=400)  # before: production only
    await asyncio.sleep(0.003)
    clock = Clock()
    clock.now = time.time()  # the start cursor falls after the pre-period's stream ids
    analysis = dataclasses.replace(ANALYSIS, cuped=True)
    first = _controller(artifacts, store, clock, analysis=analysis)
    first.start(2)
    await asyncio.sleep(0.003)
    await _traffic(store, rng, 0.5, {1: 0.05, 2: 0.05}, answers=400)
    record = await first.look()
    assert record is not None and record.covariates is not None
    assert record.last_decision is not None
    assert record.last_decision["values"]["ctr_cuped_theta"] is not None
    served = {arm: len(users) for arm, users in record.covariates.seen.items()}
    assert sum(served.values()) == 400  # every user once, in the arm that served them
    # the record keeps who each arm served, not the pre-period itself (read again on resume)
    saved = json.loads((artifacts / "rollout" / "state.json").read_text())
    assert "pre" not in saved["covariates"] and saved["covariates"]["seen"]

    second = _controller(artifacts, store, clock, analysis=analysis)  # the first was killed
    second.start(2)
    after = await second.look()
    assert after is not None and after.covariates is not None
    assert after.last_decision is not None
    assert after.last_decision["values"]["ctr_cuped_theta"] is not None
    assert {arm: len(users) for arm, users in after.covariates.seen.items()} == served


async def test_without_cuped_the_record_carries_no_covariate(artifacts: Path) -> None:
    store, clock, rng = InMemoryStore(), Clock(), np.random.default_rng(12)
    controller = _controller(
        artifacts, store, clock, analysis=dataclasses.replace(ANALYSIS, cuped=False)
    )
    controller.start(2)
    await _traffic(store, rng, 0.5, {1: 0.05, 2: 0.05}, answers=400)
    record = await controller.look()
    assert record is not None and record.covariates is None
    assert record.last_decision is not None
    assert record.last_decision["values"]["ctr_cuped_theta"] is None
