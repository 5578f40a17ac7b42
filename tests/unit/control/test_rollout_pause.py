"""The rollout controller through an outage of its stores and with an operator's request
(issue 30), on the embedded stack's files and a simulated clock."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from control.registry import FileRegistry, VersionState
from control.rollout.controller import RolloutController, RolloutPlan
from control.rollout.state import FileRolloutLog, OperatorRequest, RolloutRecord
from services.state.desired_state import FileDesiredState
from services.stores.memory import InMemoryStore
from tests.unit.control.fake_exports import production_and_candidate


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class FlakyLog(FileRolloutLog):
    """The rollout record's store, made unreachable with ``down`` (an exception to raise)."""

    down: Exception | None = None

    def load(self) -> RolloutRecord | None:
        if self.down is not None:
            raise self.down
        return super().load()


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    return production_and_candidate(tmp_path / "artifacts")


def _controller(artifacts: Path, clock: Clock, **plan: Any) -> RolloutController:
    options: dict[str, Any] = {"min_step_s": 10, "interval_s": 0.01, "step_deadline_s": 100}
    return RolloutController(
        artifacts,
        FileRegistry(artifacts / "registry.json"),
        FileDesiredState(artifacts / "rollout" / "desired.json"),
        FlakyLog(artifacts / "rollout"),
        InMemoryStore(),
        RolloutPlan(**(options | plan)),
        clock=clock,
    )


@pytest.mark.parametrize(
    "error", [RedisConnectionError("refused"), RedisTimeoutError("timed out"), OSError("down")]
)
async def test_an_outage_pauses_and_its_time_counts_toward_no_deadline(
    artifacts: Path, error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    controller = _controller(artifacts, clock)
    log = controller.log
    assert isinstance(log, FlakyLog)
    controller.start(2)
    await controller.look()  # the step starts counting
    clock.now += 60  # 60 s of the 100 s deadline without traffic
    first = await controller.look()
    assert first is not None and first.status == "running"
    log.down = error
    for _ in range(3):  # 300 s of outage, three failed looks
        clock.now += 100
        paused = await controller.look()
        assert paused is not None and paused.id == first.id and paused.status == "running"
        assert controller.paused
    log.down = None
    clock.now += 1
    resumed = await controller.look()
    assert resumed is not None and resumed.status == "running" and not controller.paused
    assert resumed.looks == first.looks + 1  # the outage's looks are not looks
    clock.now += 30  # 60 + 30 s of the step without traffic (the outage is 60 -> 361 s)
    assert (await controller.look()).status == "running"  # type: ignore[union-attr]
    clock.now += 10
    ended = await controller.look()
    assert ended is not None and (ended.status, ended.reason) == ("rolled_back", "no_traffic")
    lines = [r.getMessage() for r in caplog.records]
    assert sum("redis unreachable, pausing" in line for line in lines) == 1
    assert sum("reachable again after 301 s, resumed" in line for line in lines) == 1


async def test_an_operator_request_is_honoured_at_the_next_look_and_cleared(
    artifacts: Path,
) -> None:
    clock = Clock()
    controller = _controller(artifacts, clock)
    record = controller.start(2)
    controller.log.put_request(OperatorRequest(action="rollback", rollout="0ther", reason="x"))
    looked = await controller.look()  # a request for another rollout is ignored
    assert looked is not None and looked.status == "running"
    request = OperatorRequest(action="rollback", rollout=record.id, reason="pager: CTR dip")
    controller.log.put_request(request)
    ended = await controller.run(max_looks=5)
    assert (ended.status, ended.reason, ended.detail) == (
        "rolled_back",
        "operator",
        "pager: CTR dip",
    )
    assert controller.log.request() is None
    desired = controller.desired.read()
    assert desired is not None and (desired.production, desired.canary) == (1, None)
    assert controller.registry.get(2).state is VersionState.RETIRED  # type: ignore[union-attr]
    audit = controller.log.audit(1)[-1]
    assert (audit["event"], audit["reason"], audit["detail"]) == (
        "rolled_back",
        "operator",
        "pager: CTR dip",
    )


async def test_a_request_cuts_the_wait_between_looks_short(artifacts: Path) -> None:
    controller = _controller(artifacts, Clock(), interval_s=3600.0)
    record = controller.start(2)
    driving = asyncio.create_task(controller.run())
    await asyncio.sleep(0.2)  # the first look held; the next is an hour away
    assert not driving.done() and controller.last is not None and controller.last.looks == 1
    controller.log.put_request(OperatorRequest(action="promote", rollout=record.id))
    ended = await asyncio.wait_for(driving, 30)
    assert (ended.status, ended.reason) == ("promoted", "operator")
    assert controller.registry.production() == 2
