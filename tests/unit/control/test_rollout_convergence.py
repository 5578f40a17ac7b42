"""The controller counts a replica as applied only when it reports converged (its inference
server serves the step's versions), also after the step had been applied (issue 35)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from services.stores.memory import InMemoryStore
from tests.unit.control.test_rollout import Clock, _controller, _traffic, artifacts

__all__ = ["artifacts"]  # the fixture, used by name


async def test_a_replica_whose_server_fell_behind_gets_no_verdict_until_it_converges(
    artifacts: Path,
) -> None:
    store, clock, rng = InMemoryStore(), Clock(), np.random.default_rng(3)
    controller = _controller(
        artifacts, store, clock, weights=(0.5,), apply_deadline_s=300, step_deadline_s=5000
    )
    controller.start(2)
    revision = controller.desired.read().revision  # type: ignore[union-attr]
    report = {"replica": "gw-1", "applied_revision": revision, "converged": True}
    controller.desired.report("gw-1", report, 600)
    record = await controller.look()
    assert record is not None and record.step_applied_at == clock.now
    assert record.replicas_behind == [] and record.looks == 1
    # its Triton restarted long after the step began: behind, but the deadline starts now
    clock.now += 1000
    controller.desired.report("gw-1", {**report, "converged": False}, 600)
    await _traffic(store, rng, 0.5, {1: 0.05, 2: 0.05}, answers=200)
    record = await controller.look()
    assert record is not None and record.status == "running"
    assert record.replicas_behind == ["gw-1"] and record.looks == 1  # no verdict
    assert record.behind_since == clock.now
    clock.now += 200
    controller.desired.report("gw-1", report, 600)  # reconciled: converged again
    record = await controller.look()
    assert record is not None and record.status == "running"
    assert record.replicas_behind == [] and record.behind_since is None and record.looks == 2


async def test_a_replica_that_never_converges_rolls_the_step_back_after_the_apply_deadline(
    artifacts: Path,
) -> None:
    store, clock = InMemoryStore(), Clock()
    controller = _controller(artifacts, store, clock, weights=(0.5,), apply_deadline_s=300)
    controller.start(2)
    revision = controller.desired.read().revision  # type: ignore[union-attr]
    # applied the revision, but its server never serves the canary: not counted as applied
    report = {"replica": "gw-1", "applied_revision": revision, "converged": False}
    controller.desired.report("gw-1", report, 600)
    record = await controller.look()
    assert record is not None and record.step_applied_at is None and record.looks == 0
    clock.now += 301
    record = await controller.look()
    assert record is not None and record.status == "rolled_back"
    assert record.reason == "not_applied"
