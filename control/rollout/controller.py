"""The rollout controller: a blessed candidate reaches users step by step, judged on live
traffic against the production version served beside it, and leaves on its own when worse.

One look (``RolloutController.look``), every ``interval_s``:

0. honour the operator's request (``cascade rollback`` / ``promote`` while this controller
   holds the lock): roll back or promote now, reason ``operator``;
1. read the impression and feedback streams from where the last look stopped and add them
   to the two arms (production = control, candidate = canary): answers, items shown,
   clicks, hits, errors and degraded answers from the logged reasons, a latency histogram;
   and, for the sample-ratio test, the answers by the canary split that assigned them (each
   answer names it: a replica still loading the canary logs none);
2. abort when the candidate's artifacts vanished or a gateway replica reports it cannot
   load the candidate (production untouched); while a live replica has not applied the
   step yet, or reports that it has not converged (its inference server does not serve the
   step's versions, e.g. a restarted Triton being reconciled), give no verdict, and roll
   back with reason ``not_applied`` when that lasts ``apply_deadline_s`` (from the step's
   start, or from when a replica fell behind after the step had been applied);
3. ``analysis.analyse``: sample-ratio mismatch halts (rolled back, reason ``srm``), a
   guardrail breach fails at once, the always-valid CTR test passes, fails or holds;
4. act: fail → roll back; pass for at least ``min_step_s`` → next weight, or promote after
   the last; hold past ``step_deadline_s`` (both counted from when the replicas applied the
   step) → ``no_traffic`` when an arm got no answer in the step, else ``inconclusive``
   (``control.rollout.horizon``): stay on production, or with ``on_inconclusive``
   ``promote_non_inferior`` promote a candidate a final fixed-horizon test shows
   non-inferior (reason ``non_inferior``).

Every look's decision (values, thresholds, p-values, sample sizes) is stored in the rollout
record and appended to the audit trail; the record holds the stream cursors and counts, so a
killed controller resumes where it was. The registry's ``rollout`` lock keeps two
controllers from driving at once. When Redis (registry, desired state, rollout record,
streams) cannot be reached the look is skipped: the controller pauses, retries with backoff
and resumes the same rollout; it never acts blind, and the outage's time does not count
toward the step's deadlines (``min_step_s``, ``step_deadline_s``, ``apply_deadline_s``): an
outage measures nothing, so it neither rolls back for ``no_traffic`` nor advances a step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from control.registry import Registry, RegistryUnavailable, VersionState, adopt_served
from control.rollout.analysis import AnalysisConfig, Decision, SequentialState, analyse
from control.rollout.cuped import Covariates, read_pre_period
from control.rollout.horizon import at_horizon
from control.rollout.metrics import ROLLOUT_DECISIONS, publish
from control.rollout.state import OperatorRequest, RolloutLog, RolloutRecord
from control.rollout.streams import read_arms
from core.errors import CascadeError
from services.errors import DependencyUnavailable
from services.state.desired_state import DesiredState, DesiredStateStore
from services.stores.base import OnlineStore

log = logging.getLogger(__name__)


# what an outage of the control plane's stores raises: the look pauses, nothing is decided
UNREACHABLE = (
    RedisConnectionError,
    RedisTimeoutError,
    RegistryUnavailable,
    DependencyUnavailable,
    OSError,
)
FIRST_RETRY_S = 1.0  # while paused, retries wait 1, 2, 4 ... s, up to interval_s
REQUEST_POLL_S = 1.0  # between looks, how often an operator's request is looked for


class RolloutRefused(CascadeError):
    """The rollout cannot start or act (the message says why)."""


@dataclass(frozen=True)
class RolloutPlan:
    """Steps and timing of a rollout, and the analysis it is judged by."""

    weights: tuple[float, ...] = (0.05, 0.25, 0.5)
    min_step_s: float = 300.0
    interval_s: float = 30.0
    step_deadline_s: float = 3600.0
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)
    # how long the live replicas may take to apply a step (load the canary) before the
    # rollout is rolled back with reason not_applied; min_step_s and step_deadline_s count
    # from when they have applied it (the traffic a step is judged on)
    apply_deadline_s: float = 600.0
    # a step still undecided at step_deadline_s with traffic in both arms: "stay" on
    # production (the safe default), or "promote_non_inferior" when a final fixed-horizon
    # test shows the candidate non-inferior at the margin (spends up to alpha more)
    on_inconclusive: Literal["stay", "promote_non_inferior"] = "stay"

    def __post_init__(self) -> None:
        if self.on_inconclusive not in ("stay", "promote_non_inferior"):
            raise RolloutRefused(
                f"on_inconclusive must be stay or promote_non_inferior, got {self.on_inconclusive}"
            )
        if not self.weights or any(not 0 < w < 1 for w in self.weights):
            raise RolloutRefused(f"step weights must lie in (0, 1), got {list(self.weights)}")
        if list(self.weights) != sorted(self.weights):
            raise RolloutRefused(f"step weights must increase, got {list(self.weights)}")
        if min(self.min_step_s, self.interval_s, self.step_deadline_s, self.apply_deadline_s) <= 0:
            raise RolloutRefused(
                "min_step_s, interval_s, step_deadline_s and apply_deadline_s must be > 0"
            )
        if self.step_deadline_s < self.min_step_s:
            raise RolloutRefused("step_deadline_s must be at least min_step_s")


class RolloutController:
    """Drives one rollout through the desired state, the registry and the audit trail."""

    def __init__(
        self,
        artifacts: Path,
        registry: Registry,
        desired: DesiredStateStore,
        rollout_log: RolloutLog,
        store: OnlineStore,
        plan: RolloutPlan,
        clock: Any = time.time,
    ) -> None:
        self.artifacts = artifacts
        self.registry = registry
        self.desired = desired
        self.log = rollout_log
        self.store = store
        self.plan = plan
        self.clock = clock
        self.paused = False
        # since when the stores are away: the last complete look before the failed ones
        self.paused_since: float | None = None
        self.looked_at: float | None = None  # clock time of the last complete look
        self.outage_s = 0.0  # outage time not yet taken off the step's clocks
        self.last: RolloutRecord | None = None  # the last record read (shown while paused)
        # CUPED: (rollout id, each user's pre-rollout [clicks, items shown]), read once
        self._pre_period: tuple[str, dict[str, list[int]]] | None = None

    # -- starting -------------------------------------------------------------------------

    def start(self, version: int, force: bool = False) -> RolloutRecord:
        """Begin rolling out ``version`` (or return the running rollout of it: resume)."""
        current = self.log.load()
        if current is not None and current.status == "running":
            if current.version == version:
                log.info("resuming the rollout of version %d at step %d", version, current.step)
                return current
            raise RolloutRefused(
                f"the rollout of version {current.version} is still running: wait for it, or "
                "`cascade rollback` / `cascade promote` it first"
            )
        if not (self.artifacts / "releases" / str(version) / "manifest.json").is_file():
            raise RolloutRefused(f"version {version} has no complete export under {self.artifacts}")
        record = self.registry.get(version)
        forced = False
        if record is None or record.state == VersionState.REJECTED:
            if not force:
                why = "was never validated" if record is None else "was rejected by the gate"
                raise RolloutRefused(
                    f"version {version} {why}: run `cascade retrain`, or --force (recorded)"
                )
            unvalidated = {"verdict": "fail", "failed_checks": ["never validated"]}
            verdict = dict((record.verdict if record else None) or unvalidated)
            self.registry.register(version, {**verdict, "forced": True})
            forced = True
        elif record.state != VersionState.CANDIDATE:
            raise RolloutRefused(
                f"version {version} is {record.state.value}: only a candidate can be rolled out"
            )
        production = adopt_served(self.registry, self.artifacts)
        if production is None or production == version:
            raise RolloutRefused("there is no production version to compare the candidate with")
        self.registry.transition(version, VersionState.CANARY, "rollout started")
        now = self.clock()
        start_cursor = f"{int(now * 1000)}-0"  # stream ids are millisecond timestamps
        record_ = RolloutRecord(
            id=secrets.token_hex(4),
            version=version,
            production=production,
            weights=list(self.plan.weights),
            forced=forced or bool(record and (record.verdict or {}).get("forced")),
            started_at=now,
            step_started_at=now,
            cursors={"impressions": start_cursor, "feedback": start_cursor},
        )
        self.log.clear_request()  # one left for an earlier rollout is void
        self.log.save(record_)
        self._audit(record_, "started", {"forced": record_.forced})
        self._set_desired(
            production, version, record_.weight, 0, f"rollout {record_.id} step 0", record_.id
        )
        self._publish(record_)
        return record_

    # -- one look -------------------------------------------------------------------------

    async def look(self) -> RolloutRecord | None:
        """One analysis interval; returns the record (None when no rollout ever ran). While
        the stores cannot be reached: the last record read, unchanged (``paused`` is set)."""
        try:
            record = self.log.load()
            self._resumed(record)
            if record is None or record.status != "running":
                return record
            self.last = record
            # the outage's time counts toward no step time (kept until a look completes)
            record.step_started_at += self.outage_s
            if record.step_applied_at is not None:
                record.step_applied_at += self.outage_s
            if record.behind_since is not None:
                record.behind_since += self.outage_s
            await self._look(record)
        except UNREACHABLE as error:
            self._paused(error)
            return self.last
        self.outage_s, self.looked_at = 0.0, self.clock()
        return record

    async def _look(self, record: RolloutRecord) -> None:
        request = self.log.request()
        if request is not None and request.rollout == record.id:
            self._honour(record, request)
            return
        behind = self._replicas_behind()
        record.replicas_behind = behind
        if not behind:
            self._routing_applied(record)
            record.behind_since = None
        elif record.behind_since is None:  # the step's start, or now for one that fell back
            applied = record.step_applied_at is not None
            record.behind_since = self.clock() if applied else record.step_started_at
        if self.plan.analysis.cuped:
            await self._attach_covariates(record)
        await read_arms(self.store, record)
        problem = self._deployment_problem(record)
        if problem is not None:
            reason, detail = problem
            self._finish(record, rolled_back=True, reason=reason, detail=detail)
            return
        if behind:
            # replicas still loading the step's versions route everyone to production: no
            # verdict (a sample-ratio "mismatch" now would only measure the loading)
            waited = self.clock() - (record.behind_since or record.step_started_at)
            if waited >= self.plan.apply_deadline_s:
                self._finish(
                    record,
                    rolled_back=True,
                    reason="not_applied",
                    detail=f"{behind} did not apply step {record.step} in {waited:.0f} s",
                )
                return
            self.log.save(record)
            log.info("rollout %s: waiting for %s to apply the desired state", record.id, behind)
            return
        control_n, canary_n, weight, srm_variance = record.split_test_counts()
        decision, state = analyse(
            record.arm_stats("control"),
            record.arm_stats("canary"),
            weight,
            self.plan.analysis,
            SequentialState(**record.sequential),
            srm_requests=(control_n, canary_n),
            srm_variance=srm_variance,
            srm_heaviest=record.heaviest_user(),
        )
        record.sequential = dataclasses.asdict(state)
        record.looks += 1
        record.last_decision = _decision_dict(decision, record)
        self._audit(record, "look", record.last_decision)
        ROLLOUT_DECISIONS.labels(decision.outcome, decision.reason).inc()
        self._act(record, decision)
        self.log.save(record)
        self._publish(record, decision)

    def _paused(self, error: BaseException) -> None:
        """A look failed on an unreachable store: say so once, decide nothing."""
        self.paused = True
        if self.paused_since is None:
            self.paused_since = self.clock() if self.looked_at is None else self.looked_at
            which = f"rollout {self.last.id}" if self.last else "the rollout"
            log.warning("redis unreachable, pausing %s: %r", which, error)
        if self.last is not None:
            self._publish(self.last)

    def _resumed(self, record: RolloutRecord | None) -> None:
        """The stores answer again: say so once; the outage's length shifts the step's
        clocks at the next complete look."""
        if self.paused_since is not None:
            outage = max(0.0, self.clock() - self.paused_since)
            self.outage_s += outage
            which = f"rollout {record.id}" if record else "the rollout"
            log.warning("redis reachable again after %.0f s, resumed %s", outage, which)
        self.paused, self.paused_since = False, None

    def _honour(self, record: RolloutRecord, request: OperatorRequest) -> None:
        """End the rollout as the operator asked (their words go to the audit trail)."""
        self._finish(
            record,
            rolled_back=request.action == "rollback",
            reason="operator",
            detail=request.reason,
        )
        self.log.clear_request()

    def _act(self, record: RolloutRecord, decision: Decision) -> None:
        in_step = self.clock() - (record.step_applied_at or record.step_started_at)
        if decision.outcome == "fail":
            self._finish(record, rolled_back=True, reason=decision.reason, detail=_failed(decision))
        elif decision.outcome == "halt":
            self._finish(record, rolled_back=True, reason="srm", detail=_failed(decision))
        elif decision.outcome == "pass" and in_step >= self.plan.min_step_s:
            self._advance(record)
        elif decision.outcome == "hold" and in_step >= self.plan.step_deadline_s:
            self._at_horizon(record)

    def _at_horizon(self, record: RolloutRecord) -> None:
        """The step's deadline came undecided: no_traffic, inconclusive or non_inferior."""
        control, canary = record.arm("control"), record.arm("canary")
        step = (
            control.requests - record.step_requests.get("control", 0),
            canary.requests - record.step_requests.get("canary", 0),
        )
        horizon = at_horizon(
            record.arm_stats("control"),
            record.arm_stats("canary"),
            step,
            self.plan.analysis,
            self.clock() - record.started_at,
        )
        if record.last_decision is not None:
            record.last_decision["horizon"] = dataclasses.asdict(horizon)
        if horizon.ending == "no_traffic":
            self._finish(record, rolled_back=True, reason="no_traffic", detail=horizon.detail)
        elif self.plan.on_inconclusive == "promote_non_inferior" and horizon.non_inferior:
            detail = f"{horizon.detail}; a fixed-horizon test shows it non-inferior"
            self._finish(record, rolled_back=False, reason="non_inferior", detail=detail)
        else:
            self._finish(record, rolled_back=True, reason="inconclusive", detail=horizon.detail)

    async def _attach_covariates(self, record: RolloutRecord) -> None:
        """CUPED's covariate: each user's vouched CTR in the streams before the rollout's
        start, read once per rollout and kept in memory (after a restart, read again)."""
        if self._pre_period is None or self._pre_period[0] != record.id:
            start = f"{int(record.started_at * 1000)}-0"  # the start cursor (see start)
            window = self.plan.analysis.cuped_pre_period_s
            self._pre_period = (record.id, await read_pre_period(self.store, start, window))
        if record.covariates is None:
            record.covariates = Covariates()
        record.covariates.pre = self._pre_period[1]

    def _routing_applied(self, record: RolloutRecord) -> None:
        """Every live replica routes by the step's weight now: the step's times count from
        here (the sample-ratio test needs no such moment: each answer names its split)."""
        if record.step_applied_at is None:
            record.step_applied_at = self.clock()
            record.step_requests = {name: arm.requests for name, arm in record.arms.items()}

    def _replicas_behind(self) -> list[str]:
        """Live gateway replicas that have not applied the current desired state yet, or say
        they have not converged on it (checked on their inference server; a report without
        ``converged``, from an older gateway, counts by its revision alone)."""
        desired = self.desired.read()
        if desired is None:
            return []
        return [
            str(report.get("replica"))
            for report in self.desired.reports()
            if (report.get("applied_revision") or 0) < desired.revision
            or report.get("converged") is False
        ]

    def _deployment_problem(self, record: RolloutRecord) -> tuple[str, str] | None:
        release = self.artifacts / "releases" / str(record.version)
        if not (release / "manifest.json").is_file():
            return "artifact_missing", f"{release} is gone (deleted mid-rollout?)"
        for report in self.desired.reports():
            if report.get("canary_failed") == record.version:
                problems = "; ".join(report.get("problems", []))
                return "canary_load_failed", f"replica {report.get('replica')}: {problems}"
        return None

    # -- moving on ------------------------------------------------------------------------

    def _advance(self, record: RolloutRecord) -> None:
        if record.step + 1 >= len(record.weights):
            self._finish(record, rolled_back=False, reason="kpi_pass")
            return
        record.step += 1
        record.step_started_at = self.clock()
        record.step_applied_at = None
        record.behind_since = None
        self._audit(record, "step", {"step": record.step, "weight": record.weight})
        self._set_desired(
            record.production,
            record.version,
            record.weight,
            record.step,
            f"rollout {record.id} step {record.step}",
        )

    def _finish(
        self, record: RolloutRecord, rolled_back: bool, reason: str, detail: str = ""
    ) -> None:
        """Roll back (canary out, production untouched) or promote (canary -> production)."""
        if rolled_back:
            self._set_desired(record.production, None, 0.0, record.step, f"rolled back: {reason}")
            self.registry.transition(record.version, VersionState.RETIRED, f"rolled back: {reason}")
            record.status = "rolled_back"
        else:
            self._set_desired(record.version, None, 0.0, record.step, f"promoted: {reason}")
            self.registry.transition(record.version, VersionState.PRODUCTION, f"promoted: {reason}")
            record.status = "promoted"
        record.reason, record.detail = reason, detail
        self.log.save(record)
        self._audit(record, record.status, {"reason": reason, "detail": detail})
        self._publish(record)
        log.warning(
            "rollout %s of version %d %s: %s %s",
            record.id,
            record.version,
            record.status.replace("_", " "),
            reason,
            detail,
        )

    def rollback(self, reason: str = "manual") -> RolloutRecord | None:
        """Roll the running rollout back now (reason ``operator``, ``reason`` as its detail);
        with none running, restore the previous production (undo the last promotion). The
        caller holds the ``rollout`` lock. Returns the rollout record it acted on."""
        self.log.clear_request()  # acted on here: no controller must act on it again
        record = self.log.load()
        if record is not None and record.status == "running":
            self._finish(record, rolled_back=True, reason="operator", detail=reason)
            return record
        previous = self.registry.previous_production()
        if previous is None:
            raise RolloutRefused("nothing to roll back: no rollout runs and no previous production")
        self.registry.transition(previous, VersionState.PRODUCTION, f"rolled back: {reason}")
        self._set_desired(previous, None, 0.0, 0, f"rolled back to {previous}: {reason}")
        return record

    def promote(self, reason: str = "manual") -> RolloutRecord:
        """Promote the running rollout's canary now (reason ``operator``); the caller holds
        the ``rollout`` lock."""
        self.log.clear_request()
        record = self.log.load()
        if record is None or record.status != "running":
            raise RolloutRefused("no rollout is running: nothing to promote")
        self._finish(record, rolled_back=False, reason="operator", detail=reason)
        return record

    # -- plumbing -------------------------------------------------------------------------

    def _set_desired(
        self,
        production: int,
        canary: int | None,
        weight: float,
        step: int,
        reason: str,
        salt: str | None = None,
    ) -> DesiredState:
        """Compare-and-set the desired state (re-read and retry when a writer raced us).
        ``salt``: a new rollout's user-assignment salt (None keeps the current one)."""
        for _ in range(5):
            current = self.desired.read()
            fields: dict[str, object] = {
                "production": production,
                "canary": canary,
                "canary_weight": weight,
                "step": step,
                "reason": reason,
            }
            if salt is not None:
                fields["assignment_salt"] = salt
            if current is None:
                state = DesiredState.model_validate({"revision": 1, **fields})
                expected = 0
            else:
                state, expected = current.next(**fields), current.revision
            try:
                return self.desired.write(state, expected)
            except CascadeError:
                continue
        raise RolloutRefused("the desired state keeps changing under the controller")

    def _audit(self, record: RolloutRecord, event: str, details: dict[str, Any]) -> None:
        self.log.append(
            {
                "at": self.clock(),
                "rollout": record.id,
                "version": record.version,
                "production": record.production,
                "step": record.step,
                "weight": record.weight,
                "event": event,
                **details,
            }
        )

    def _publish(self, record: RolloutRecord, decision: Decision | None = None) -> None:
        publish(record, decision, self.paused, self.plan.analysis)

    async def run(
        self,
        lock: Any | None = None,
        max_looks: int | None = None,
        on_look: Callable[[RolloutRecord], None] | None = None,
    ) -> RolloutRecord:
        """Look every interval until the rollout is promoted or rolled back (``max_looks``:
        at most that many looks). While paused (the stores unreachable) retry with backoff;
        between looks, look at once when the operator asks. ``lock``: the held ``rollout``
        lock (its heartbeat keeps it); once lost, stop (``LockLost``)."""
        looks, retry_s = 0, 0.0
        while True:
            if lock is not None:
                lock.check()
            record = await self.look()
            looks += 1
            if record is None:
                raise RolloutRefused("no rollout to drive: start one with `cascade rollout N`")
            if on_look is not None:
                on_look(record)
            if record.status != "running" or (max_looks is not None and looks >= max_looks):
                return record
            if self.paused:
                retry_s = min(self.plan.interval_s, max(FIRST_RETRY_S, 2 * retry_s))
                await asyncio.sleep(retry_s)
            else:
                retry_s = 0.0
                await self._until_next_look()

    async def _until_next_look(self) -> None:
        """Sleep ``interval_s``, or less when an operator's request arrives."""
        deadline = time.monotonic() + self.plan.interval_s
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(REQUEST_POLL_S, left))
            try:
                request = self.log.request()
            except UNREACHABLE:
                return  # the next look pauses
            if request is not None and self.last is not None and request.rollout == self.last.id:
                return


def _decision_dict(decision: Decision, record: RolloutRecord) -> dict[str, Any]:
    return {
        "outcome": decision.outcome,
        "reason": decision.reason,
        "look": record.looks,
        "checks": [dataclasses.asdict(check) for check in decision.checks],
        "values": decision.values,
    }


def _failed(decision: Decision) -> str:
    """What the failed checks of a look measured (the rollback's log line and audit entry)."""
    return "; ".join(f"{c.name}: {c.detail}" for c in decision.checks if c.passed is False)
