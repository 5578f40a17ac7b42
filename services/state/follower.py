"""A gateway replica follows the desired serving state (production, canary, weight) without
a restart.

Every ``interval_s`` the follower reads the desired state (from Redis, or the embedded
stack's file). On a new revision it loads what is missing in the background — the release
(index, workflow, item tables; verified) and the model versions on the inference backend
(Triton: a repository load with the versions listed) — and only then routes users to them.
It never waits on the request path and never makes things worse:

- a canary that cannot be loaded is not routed to (every user stays on production), and the
  problem is shown in readiness and counted;
- a production version that cannot be loaded leaves the current routing as it is;
- when the desired state cannot be read, the last known state keeps being served;
- the previous production stays loaded for ``keep_previous_s`` (an instant rollback), and a
  version nobody is routed to any more is dropped only after ``retire_after_s``, so requests
  already in flight finish on the version they started with.

Every tick it also reconciles (``services.state.reconcile``): it asks its inference server
which versions are READY and loads or unloads until they are the versions this gateway
holds, so a Triton that restarted (serving its repository's default) is back on the
production and canary within a tick or two. A revision that arrives while the server is
unreachable waits (it is retried every tick, never taken for a canary that cannot load).

Between ticks it waits on the store: a write to Redis is announced (pub/sub) and applied at
once, the interval is the fallback.

The replica reports what it applied and whether it has converged (the desired revision
applied, routed as desired, every desired version READY on its server: checked, not
assumed; ``missing`` says what is not) under a short ttl, renewed every ``interval_s`` by its
own task, so a slow model load does not let it lapse while a stopped replica stops
counting as live within seconds; ``close()`` withdraws it at once. The controller waits
for every live replica to report converged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import socket
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, NamedTuple, Protocol

from services.metrics import (
    CANARY_WEIGHT,
    REPLICA_CONVERGED,
    ROLLOUT_REVISION,
    VERSION_LOAD_FAILURES,
    version_label,
)
from services.serving.release import load_release
from services.serving.routing import VersionRouter
from services.serving.rules import Rules
from services.state.desired_state import DesiredState, DesiredStateStore, describe
from services.state.reconcile import Reconciler
from services.util.background import BackgroundTask

if TYPE_CHECKING:
    from services.inference.backends import InferenceBackend
    from services.serving.release import Release
    from services.settings import Settings

log = logging.getLogger(__name__)


class Followed(Protocol):
    """What the follower changes of a gateway (``services.serving.gateway.Gateway``): the loaded
    releases, the router, the versions the backend serves; a release it loads gets the
    gateway's rules. A protocol, so that the follower does not import the gateway that
    starts it."""

    settings: Settings
    backend: InferenceBackend
    releases: dict[int, Release]
    router: VersionRouter | None
    rules: Rules

    async def warm_up(self, versions: list[int]) -> None: ...


class Applied(NamedTuple):
    """One application of a desired state by a follower, as it ended."""

    revision: int
    outcome: str
    canary_failed: int | None
    problems: tuple[str, ...]


REPORT_TTL_S = 5.0  # at least; 3 intervals when longer (renewed every interval)


class StateFollower:
    """Applies the desired state to one gateway; ``status()`` is what readiness shows."""

    def __init__(
        self,
        gateway: Followed,
        store: DesiredStateStore,
        interval_s: float = 1.0,
        keep_previous_s: float = 600.0,
        retire_after_s: float = 30.0,
        read_timeout_s: float = 1.0,
    ) -> None:
        self.gateway = gateway
        self.store = store
        self.interval_s = interval_s
        self.keep_previous_s = keep_previous_s
        self.retire_after_s = retire_after_s
        self.read_timeout_s = read_timeout_s
        self.desired: DesiredState | None = None  # the last state read
        self.applied_revision: int | None = None
        self.reachable = True
        self.problems: list[str] = []
        self.canary_failed: int | None = None  # a desired canary this replica cannot load
        # the last applications (revision, outcome, canary_failed, problems), newest last: a
        # failed canary's state is replaced as soon as the rollback applies, these stay
        self.history: deque[Applied] = deque(maxlen=32)
        self.previous: tuple[int, float] | None = None  # (old production, since)
        self.unrouted_since: dict[int, float] = {}
        self.reconciler = Reconciler(gateway.backend, timeout_s=max(read_timeout_s, 2.0))
        self._background = BackgroundTask()
        self._reporting = BackgroundTask()
        self._report_lock = threading.Lock()  # a report written vs. one withdrawn
        self._withdrawn = False
        # one id per following gateway (several may share a process: tests, benchmarks)
        self.replica = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"

    async def read(self) -> DesiredState | None:
        """The desired state, or the last known one when the store cannot be read."""
        try:
            state = await asyncio.wait_for(asyncio.to_thread(self.store.read), self.read_timeout_s)
        except Exception as error:
            if self.reachable:
                log.warning("desired state unreadable, serving the last known: %r", error)
            self.reachable = False
            return self.desired
        self.reachable = True
        self.desired = state
        return state

    async def check(self) -> None:
        """One tick: apply a new revision, drop versions whose grace ran out, bring the
        inference server back to this gateway's versions, report."""
        state = await self.read()
        if state is not None and state.revision != self.applied_revision:
            if self.reachable:  # loading can take long: say first that this one is behind
                await self._report()
            await self.apply(state)
        await self._retire()
        await self.reconciler.reconcile(self.gateway.releases)
        REPLICA_CONVERGED.set(0 if self.convergence() else 1)
        if self.applied_revision is not None:  # also the one the gateway started on
            ROLLOUT_REVISION.set(self.applied_revision)
        if self.reachable:  # also before any desired state: the controller then waits
            await self._report()

    async def _report(self) -> None:
        """Tell the controller what this replica serves (it aborts a canary no replica can
        load). Best effort: the controller treats a missing report as unknown."""
        status = {"replica": self.replica, **self.status(), "at": time.time()}
        status.pop("desired", None)
        ttl_s = max(REPORT_TTL_S, 3 * self.interval_s)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                asyncio.to_thread(self._write_report, status, ttl_s), self.read_timeout_s
            )

    def _write_report(self, status: dict, ttl_s: float) -> None:
        with self._report_lock:  # never after close() withdrew it
            if not self._withdrawn:
                self.store.report(self.replica, status, ttl_s)

    def _withdraw_report(self) -> None:
        with self._report_lock:
            self._withdrawn = True
            self.store.remove_report(self.replica)

    async def apply(self, state: DesiredState) -> None:
        """Load what ``state`` needs and route by it; the revision counts as applied unless
        the inference server was unreachable (then the next tick tries again)."""
        gateway = self.gateway
        if await self._server_down(state):
            return
        problems: list[str] = []
        old_production = gateway.router.default if gateway.router else None
        for version in state.versions:
            if version not in gateway.releases:
                try:
                    release = await asyncio.to_thread(
                        load_release, gateway.settings.artifacts, version, gateway.rules
                    )
                    gateway.releases[version] = release
                except Exception as error:
                    problems.append(f"release {version} cannot be loaded: {error}")
        if state.production not in gateway.releases:
            VERSION_LOAD_FAILURES.labels(role="production").inc()
            self._done(state, problems, "production not loadable: routing unchanged")
            return
        canary = state.canary if state.canary in gateway.releases else None
        if old_production is not None and old_production != state.production:
            self.previous = (old_production, time.monotonic())
        wanted = {state.production, *([canary] if canary else []), *self._kept_previous()}
        routed = set(gateway.router.versions) if gateway.router else set()
        for version in routed - wanted:  # requests may be on it: it retires after the grace
            self.unrouted_since.setdefault(version, time.monotonic())
        serving = sorted(wanted | set(self.unrouted_since) & set(gateway.releases))
        try:
            await gateway.backend.serve_versions(serving)
        except Exception as error:
            if await self._server_down(state):  # it went away: not the versions' fault
                return
            if canary is None:
                VERSION_LOAD_FAILURES.labels(role="production").inc()
                problems.append(f"model versions {serving} cannot be loaded: {error}")
                self._done(state, problems, "production not loadable: routing unchanged")
                return
            problems.append(f"canary {canary} cannot be loaded by the inference backend: {error}")
            serving.remove(canary)
            gateway.releases.pop(canary, None)
            canary = None
            await gateway.backend.serve_versions(serving)
        self.canary_failed = state.canary if state.canary is not None and canary is None else None
        if self.canary_failed is not None:
            VERSION_LOAD_FAILURES.labels(role="canary").inc()
        await gateway.warm_up([v for v in (state.production, canary) if v is not None])
        # readiness judges the routed versions by the last look at the server: take it after
        # the load, or the new canary reads as unserved (503) until the tick's reconcile
        await self.reconciler.observe(serving)
        weight = state.canary_weight if canary is not None else 0.0
        gateway.router = VersionRouter(
            state.production, canary, weight * 100, state.assignment_salt
        )
        for version in list(gateway.releases):
            if version in wanted:
                self.unrouted_since.pop(version, None)
            else:
                self.unrouted_since.setdefault(version, time.monotonic())
        self._export_weights(state.production, canary, weight)
        self._done(state, problems, "applied")

    async def _server_down(self, state: DesiredState) -> bool:
        """True (and said) when the inference server cannot be asked: ``state`` then waits."""
        observed = await self.reconciler.observe(state.versions)
        if observed.reachable:
            return False
        problem = f"revision {state.revision} waits: {observed.missing(state.versions)[0]}"
        if problem not in self.problems:
            log.warning("desired state %s: %s", describe(state), problem)
        self.problems = [problem]
        return True

    def _kept_previous(self) -> set[int]:
        if self.previous is None:
            return set()
        version, since = self.previous
        if time.monotonic() - since > self.keep_previous_s or version not in self.gateway.releases:
            return set()
        return {version}

    async def _retire(self) -> None:
        """Drop versions no user has been routed to for ``retire_after_s``."""
        router = self.gateway.router
        routed = set(router.versions) if router else set()
        now = time.monotonic()
        kept = self._kept_previous()
        for version in list(self.gateway.releases):
            if version in routed or version in kept:
                continue
            since = self.unrouted_since.setdefault(version, now)
            if now - since >= self.retire_after_s:
                self.gateway.releases.pop(version)
                self.unrouted_since.pop(version)
                log.info("model version %d retired from this gateway", version)
                with contextlib.suppress(Exception):  # not fatal: the next apply retries
                    await self.gateway.backend.serve_versions(sorted(self.gateway.releases))

    def _export_weights(self, production: int, canary: int | None, weight: float) -> None:
        served = self.gateway.releases
        for version in served:
            share = weight if version == canary else (1 - weight if version == production else 0)
            CANARY_WEIGHT.labels(model_version=version_label(version, served)).set(share)

    def _done(self, state: DesiredState, problems: list[str], outcome: str) -> None:
        self.applied_revision = state.revision
        self.problems = problems
        self.history.append(Applied(state.revision, outcome, self.canary_failed, tuple(problems)))
        ROLLOUT_REVISION.set(state.revision)
        for problem in problems:
            log.error("desired state revision %d: %s", state.revision, problem)
        log.info("desired state %s: %s", describe(state), outcome)

    def convergence(self) -> list[str]:
        """What keeps this replica from serving the desired state, in words (empty: it has
        converged): the revision not applied, routing that differs, a desired version its
        inference server does not serve (as last checked). Before any desired state: the
        versions it routes to."""
        desired, router = self.desired, self.gateway.router
        if desired is None:
            return self.unserved()
        gaps = []
        if self.applied_revision != desired.revision:
            gaps.append(f"desired revision {desired.revision} not applied")
        elif (
            router is None
            or (router.default, router.canary) != (desired.production, desired.canary)
            or not math.isclose(router.canary_percent, desired.weight_percent)
        ):
            gaps.append(f"routing differs from the desired state ({describe(desired)})")
        return gaps + self.reconciler.missing(desired.versions)

    def unserved(self) -> list[str]:
        """What of the versions users are routed to the inference server does not serve (as
        last checked): readiness is false while there is any."""
        router = self.gateway.router
        return self.reconciler.missing(router.versions if router is not None else [])

    def status(self) -> dict[str, object]:
        router = self.gateway.router
        missing = self.convergence()
        last = self.reconciler.last
        return {
            "replica": self.replica,  # the name the controller's replicas_behind uses
            "desired": None if self.desired is None else self.desired.model_dump(),
            "applied_revision": self.applied_revision,
            "reachable": self.reachable,
            "routing": None
            if router is None
            else {
                "production": router.default,
                "canary": router.canary,
                "canary_percent": router.canary_percent,
            },
            "problems": list(self.problems),
            "canary_failed": self.canary_failed,
            "converged": not missing,
            "missing": missing,
            # READY versions per model on the inference server, as last checked (None: no
            # server of its own, or not reachable)
            "served": last.as_report() if last is not None else None,
        }

    async def _run(self) -> None:
        while True:  # the first tick at once: readiness waits on its check of the server
            try:
                await self.check()
            except Exception:  # a bug here must never stop following
                log.exception("following the desired state failed")
            await self.store.wait_for_change(self.interval_s)  # sooner when a write is announced

    async def _keep_reporting(self) -> None:
        """Renew the report every interval, also while ``check()`` waits on a long load."""
        while True:
            await asyncio.sleep(self.interval_s)
            if self.reachable:
                await self._report()

    def start(self) -> None:
        self._background.start(self._run())
        self._reporting.start(self._keep_reporting())

    async def close(self) -> None:
        """Stop following and withdraw this replica's report (it no longer serves)."""
        await self._background.stop()
        await self._reporting.stop()
        await self.store.stop_watching()
        try:
            await asyncio.wait_for(asyncio.to_thread(self._withdraw_report), 2.0)
        except Exception as error:  # its short ttl ends it soon anyway
            log.warning("replica report not withdrawn (%r): it expires on its own", error)
        await asyncio.to_thread(self.store.close)
