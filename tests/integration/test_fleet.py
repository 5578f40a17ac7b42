"""A serving fleet converges (issue 35): two gateway processes, each with its own Triton
(``tests/integration/fleet_shape.py``), one durable Redis and a 3-node Redis Cluster for the
cache (the ranker's embedding rows), a canary rollout across both; one Triton
is killed mid-rollout. Its gateway keeps answering, degraded, never 5xx, and leaves
readiness; the rollout does not count it as applied; its Triton comes back (the gateway's
supervisor restarts it, serving only its repository's default) and the reconcile loop
brings it back to production and canary."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from control.rollout.state import RolloutRecord
from pipelines.config import TrainConfig
from services.inference.triton_server import TritonUnavailable, wheel_directory
from tests.conftest import EXPORTED_TRAINING
from tests.integration.control_processes import wait_until
from tests.integration.fleet_shape import fleet, fleet_export

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_killed_triton_comes_back_on_the_desired_versions(exported: Path, tmp_path: Path) -> None:
    try:
        wheel_directory()
    except TritonUnavailable as error:
        pytest.skip(f"Triton cannot run here: {error}")
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (.ci/run installs it)")
    root = fleet_export(exported, tmp_path / "artifacts", TrainConfig(**EXPORTED_TRAINING))
    with fleet(root, tmp_path / "fleet", replicas=2, cache_cluster=True) as stack:
        a, b = stack.replicas
        for replica in (a, b):  # each Triton started on its deployed default
            assert replica.triton_serves(1) and not replica.triton_serves(2)
        rollout = stack.rollout()
        readiness: list[int] = []  # while the replicas load the canary

        def applied() -> RolloutRecord | None:
            readiness.extend(replica.readiness()[0] for replica in (a, b))
            record = stack.record()
            return record if record is not None and record.step_applied_at is not None else None

        record = wait_until(applied, 180, "both replicas applied the canary step")
        assert record.status == "running" and record.replicas_behind == []
        # loading the canary is not leaving the load balancer: routed versions stay served
        assert set(readiness) == {200}, readiness
        reports = stack.reports()
        assert len(reports) == 2 and all(r["converged"] for r in reports.values()), reports
        assert all(r["served"] == {"ranker": [1, 2]} for r in reports.values())
        name_a = a.status()["replica"]
        b_triton = b.triton_pid()
        loads = a.metric("cascade_reconcile_actions_total", action="load")

        killed = a.kill_triton()
        outage = Outage()

        def back() -> bool:
            answer = a.recommend(user_id=len(outage.statuses) % 300)
            outage.statuses.append(answer.status_code)
            outage.degraded += answer.status_code == 200 and answer.json()["degraded"]
            code, body = a.readiness()
            outage.unready |= code == 503 and bool(body["unserved"])
            report = stack.reports().get(name_a, {})
            outage.reported |= report.get("converged") is False and bool(report.get("missing"))
            now = stack.record()
            outage.behind |= now is not None and now.replicas_behind == [name_a]
            restarted = a.triton_pid() not in (None, killed)
            return restarted and code == 200 and report.get("converged") is True

        wait_until(back, 180, "the killed Triton is back and its replica converged")
        assert max(outage.statuses) < 500, outage
        assert outage.degraded, "no degraded answer while its Triton was down"
        assert outage.unready, "readiness stayed 200 while its Triton lacked the versions"
        assert outage.reported, "the replica's report never said it had not converged"
        assert outage.behind, "the rollout never counted the replica as behind"
        # back on production and canary: checked on that Triton itself
        assert a.triton_serves(1) and a.triton_serves(2)
        assert a.metric("cascade_reconcile_actions_total", action="load") > loads
        assert a.metric("cascade_replica_converged") == 1
        record = wait_until(
            lambda: (r := stack.record()) is not None and not r.replicas_behind and r,
            30,
            "the rollout counts the replica as applied again",
        )
        assert record.status == "running" and record.behind_since is None
        assert b.triton_pid() == b_triton and b.status()["converged"] is True  # untouched
        assert rollout.poll() is None, (tmp_path / "fleet" / "rollout.log").read_text()


@dataclass
class Outage:
    """What the test saw while one Triton was down."""

    statuses: list[int] = field(default_factory=list)  # of the gateway's answers
    degraded: int = 0
    unready: bool = False  # readiness said 503, naming what is not served
    reported: bool = False  # its report to the controller said not converged
    behind: bool = False  # the rollout record counted it as behind
