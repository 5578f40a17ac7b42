"""The rollout controller rides out a Redis outage (issue 30): a real controller process on a
private redis-server (append-only file) that is stopped for several seconds mid-rollout and
started again on the same port and data."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.integration import control_processes as processes
from tests.integration.test_feedback_durability import RedisProcess

pytestmark = pytest.mark.integration

OUTAGE_S = 8.0
STEP_DEADLINE_S = 6.0  # shorter than the outage: were the outage counted, no_traffic follows


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path / "redis", persist=True)
    server.directory.mkdir()
    server.start()
    yield server
    server.kill()


def test_the_controller_pauses_through_an_outage_and_resumes_the_same_rollout(
    tmp_path: Path, server: RedisProcess
) -> None:
    url = server.url
    root = processes.export(tmp_path / "export", url)
    log = processes.rollout_log(root, url)
    controller = processes.controller(
        tmp_path / "controller",
        root,
        url,
        "--step-deadline-s",
        str(STEP_DEADLINE_S),
        "--min-step-s",
        str(STEP_DEADLINE_S),
        "--lock-ttl",
        "3",
    )
    try:
        before = processes.wait_running(controller, log)
        assert server.process is not None
        server.process.terminate()  # a clean stop: the append-only file has every write
        server.process.wait(timeout=10)
        time.sleep(OUTAGE_S)  # connection refused, for longer than the step deadline
        assert controller.alive(), controller.output()
        server.start()  # same port, same data
        log = processes.rollout_log(root, url)

        def looked_again() -> object:
            assert controller.alive(), controller.output()
            record = log.load()
            return record if record is not None and record.looks > before.looks else None

        after = processes.wait_until(looked_again, 30, "a look after the outage")
        assert after.id == before.id and after.step == before.step
        assert after.status == "running", (after.reason, controller.output())
        # the outage stopped the step's clock: it is not past its deadline now
        assert after.step_started_at > before.step_started_at + OUTAGE_S - 1
        client = redis.Redis.from_url(url)
        holder = processes.wait_until(
            lambda: client.get(f"{processes.NAMESPACE}:registry:lock:rollout"), 10, "the lock"
        )
        assert json.loads(holder)["holder"].endswith(f":{controller.process.pid}")
        client.close()
    finally:
        controller.stop()
    logged = controller.output()
    assert logged.count("redis unreachable, pausing") == 1, logged
    assert logged.count("resumed rollout") == 1, logged
