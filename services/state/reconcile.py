"""Make this replica's inference server serve what the replica needs, checked, not assumed.

A Triton beside each gateway (a sidecar on loopback) can restart on its own: it comes back
serving whatever its repository's version policy loads, not the production and canary the
gateway routes users to. Every follower tick, ``Reconciler.reconcile`` asks the server
which versions of each model are READY (its repository index with the control key, else
the open per-version readiness API), and when they differ from
the versions the gateway holds releases for, loads and unloads to match (one load per
model with a ``specific`` version policy). What it last saw is what readiness, the
replica's report to the rollout controller and ``cascade_replica_converged`` are built on.

The in-process backend has no server of its own to lose: there is nothing to check, and
every version the gateway loaded counts as served.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from services.inference.backends import InferenceBackend
from services.inference.placement import PlacedBackend
from services.inference.triton import TritonBackend
from services.metrics import RECONCILE_ACTIONS

log = logging.getLogger(__name__)


def triton_of(backend: InferenceBackend | None) -> TritonBackend | None:
    """The Triton client among ``backend``'s parts (the ranker's when the query tower runs
    in the gateway), or None when every model runs in this process."""
    if isinstance(backend, PlacedBackend):
        backend = backend.ranker
    return backend if isinstance(backend, TritonBackend) else None


@dataclass(frozen=True)
class Observation:
    """What the server said it serves: READY versions per model, or why it could not say."""

    served: dict[str, frozenset[int]] = field(default_factory=dict)
    error: str | None = None  # the server could not be asked (down, restarting, refused)
    # a GPU-target ranker's parts (FIL trees, ONNX dense part): the versions calling each
    callers: dict[str, frozenset[int]] = field(default_factory=dict)

    @property
    def reachable(self) -> bool:
        return self.error is None

    def needed(self, model: str, versions: Iterable[int]) -> set[int]:
        """The versions of ``model`` that serving ``versions`` needs: all of them, or for a
        ranker's part those whose ranker calls it."""
        wanted = set(versions)
        return wanted & self.callers[model] if model in self.callers else wanted

    def missing(self, versions: Iterable[int]) -> list[str]:
        """What keeps ``versions`` from being served, in words (empty: all are READY)."""
        if self.error is not None:
            return [f"inference server unreachable: {self.error}"]
        wanted = sorted(set(versions))
        return [
            f"{model} version {version} not ready on the inference server"
            for model, ready in sorted(self.served.items())
            for version in sorted(self.needed(model, wanted))
            if version not in ready
        ]

    def as_report(self) -> dict[str, list[int]] | None:
        return None if self.error is not None else {m: sorted(v) for m, v in self.served.items()}


class Reconciler:
    """Checks and converges the versions one replica's Triton serves."""

    def __init__(self, backend: InferenceBackend | None, timeout_s: float = 2.0) -> None:
        self.triton = triton_of(backend)
        self.timeout_s = timeout_s
        self.last: Observation | None = None  # None: not asked yet

    @property
    def checks(self) -> bool:
        """False when the models run in this process (nothing can drift from under it)."""
        return self.triton is not None

    def missing(self, versions: Iterable[int]) -> list[str]:
        """What the last observation lacks of ``versions`` (nothing when there is no server)."""
        if self.triton is None:
            return []
        if self.last is None:
            return ["inference server not checked yet"]
        return self.last.missing(versions)

    async def observe(self, versions: Iterable[int]) -> Observation:
        """Ask the server which versions are READY (all of them with the control key, else
        which of ``versions``); never raises."""
        if self.triton is None:
            return Observation()
        try:
            served = await asyncio.wait_for(self.triton.served_versions(versions), self.timeout_s)
        except Exception as error:  # down, restarting, hung, refused: all mean "not served"
            observed = Observation(error=_describe(error))
        else:
            wanted = self.triton.wanted(versions)
            callers = {m: frozenset(v) for m, v in wanted.items() if m not in self.triton.models}
            observed = Observation({m: frozenset(v) for m, v in served.items()}, None, callers)
        self.last = observed
        return observed

    async def reconcile(self, versions: Iterable[int]) -> Observation:
        """Load what of ``versions`` is not READY, unload READY versions not among them;
        return what the server serves afterwards. A failed load is logged, not raised: the
        next tick tries again, and until then readiness and the report say what is missing."""
        target = sorted(set(versions))
        observed = await self.observe(target)
        if self.triton is None or not observed.reachable or not target:
            return observed
        needed = {m: observed.needed(m, target) for m in observed.served}
        loads = {(m, v) for m, ready in observed.served.items() for v in needed[m] - ready}
        unloads = {(m, v) for m, ready in observed.served.items() for v in ready - needed[m]}
        if not loads and not unloads:
            return observed
        log.warning(
            "inference server drifted from this replica's versions %s: loading %s, unloading %s",
            target,
            sorted(loads),
            sorted(unloads),
        )
        try:
            await self.triton.serve_versions(target)
        except Exception as error:
            log.error("reconciling the inference server to %s failed: %r", target, error)
        after = await self.observe(target)
        if after.reachable:
            done_loads = sum(v in after.served.get(m, ()) for m, v in loads)
            done_unloads = sum(v not in after.served.get(m, ()) for m, v in unloads)
            RECONCILE_ACTIONS.labels(action="load").inc(done_loads)
            RECONCILE_ACTIONS.labels(action="unload").inc(done_unloads)
        return after


def _describe(error: BaseException) -> str:
    if isinstance(error, TimeoutError | asyncio.TimeoutError):
        return "no answer in time"
    return f"{type(error).__name__}: {error}"[:200]
