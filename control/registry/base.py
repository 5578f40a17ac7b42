"""The registry's operations over one stored document, whatever stores it."""

from __future__ import annotations

import contextlib
import logging
import secrets
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

from control.registry.lock import Lock, sigterm_as_exit
from control.registry.records import (
    ALLOWED,
    Change,
    RegistryError,
    State,
    T,
    VersionRecord,
    VersionState,
    audit_entry,
    check_verdict,
    move,
)

log = logging.getLogger(__name__)


class Registry(ABC):
    """The contract; backends provide storage (``_read``, ``_mutate``), audit and locks."""

    @abstractmethod
    def _read(self) -> State: ...

    @abstractmethod
    def _mutate(self, change: Change[T]) -> T:
        """Run ``change`` on the current state atomically; store it and its audit entries."""

    @abstractmethod
    def audit(self, count: int = 100) -> list[dict[str, Any]]:
        """The newest ``count`` audit entries, oldest first."""

    @abstractmethod
    def _take_lock(self, name: str, token: str, ttl_s: float) -> float: ...

    @abstractmethod
    def _refresh_lock(self, name: str, token: str, ttl_s: float) -> float: ...

    @abstractmethod
    def _release_lock(self, name: str, token: str) -> None: ...

    def close(self) -> None:  # noqa: B027 - only the Redis backend holds connections
        """Release connections (nothing for the file backend)."""

    def register(self, version: int, verdict: dict[str, Any]) -> VersionRecord:
        """Record a validated export: candidate if it passed (or was forced), else rejected.

        Registering again with the same verdict changes nothing; with another verdict, a
        candidate or rejected version takes the new one (the gate ran again); a version
        adopted without a verdict just records it."""
        verdict = check_verdict(version, verdict)
        forced = bool(verdict.get("forced"))
        to = (
            VersionState.CANDIDATE
            if verdict["verdict"] == "pass" or forced
            else VersionState.REJECTED
        )
        reason = f"validation: {verdict['verdict']}" + (" (forced)" if forced else "")

        def change(state: State) -> tuple[VersionRecord, list[dict[str, Any]]]:
            record = state.versions.get(version)
            if record is not None and record.verdict == verdict:
                return record, []
            if record is None:
                entry = move(state, version, to, reason, "register")
                state.versions[version].verdict = verdict
                return state.versions[version], [entry]
            if record.verdict is None:  # adopted without one: record it, state unchanged
                record.verdict = verdict
                state_now = record.state.value
                return record, [audit_entry(version, "register", state_now, state_now, reason)]
            if record.state not in (VersionState.CANDIDATE, VersionState.REJECTED):
                raise RegistryError(
                    f"version {version} is {record.state}: its verdict can no longer change"
                )
            record.verdict = verdict
            return record, [move(state, version, to, f"re-{reason}", "register")]

        return self._mutate(change)

    def transition(self, version: int, to: VersionState, reason: str) -> VersionRecord:
        """Move ``version`` to ``to`` (see the module's table); promoting a version to
        production retires the old production, which becomes the previous production."""
        try:
            to = VersionState(to)
        except ValueError:
            raise RegistryError(
                f"version {version}: no state {to!r} (one of {', '.join(VersionState)})"
            ) from None

        def change(state: State) -> tuple[VersionRecord, list[dict[str, Any]]]:
            record = state.versions.get(version)
            if record is None:
                raise RegistryError(f"version {version} is not registered")
            if record.state is to:
                return record, []
            if to not in ALLOWED[record.state]:
                allowed = ", ".join(sorted(ALLOWED[record.state])) or "none (promote another)"
                raise RegistryError(
                    f"version {version}: {record.state} -> {to} is not allowed "
                    f"(from {record.state}: {allowed})"
                )
            if record.state is VersionState.RETIRED and version != state.previous_production:
                raise RegistryError(
                    f"version {version}: retired -> production is only for the previous "
                    f"production (version {state.previous_production}), as a rollback"
                )
            canary = state.canary()
            if to is VersionState.CANARY and canary is not None:
                raise RegistryError(
                    f"version {version}: candidate -> canary refused, version {canary} is "
                    "the canary (retire or promote it first)"
                )
            entries = []
            if to is VersionState.PRODUCTION:
                old = state.production
                if old is not None and old != version:
                    why = f"superseded by version {version}: {reason}"
                    entries.append(move(state, old, VersionState.RETIRED, why))
                    state.previous_production = old
                state.production = version
            entries.append(move(state, version, to, reason))
            return record, entries

        return self._mutate(change)

    def get(self, version: int) -> VersionRecord | None:
        return self._read().versions.get(version)

    def records(self) -> list[VersionRecord]:
        """Every record, oldest version first."""
        return [r for _, r in sorted(self._read().versions.items())]

    def production(self) -> int | None:
        return self._read().production

    def previous_production(self) -> int | None:
        return self._read().previous_production

    def canary(self) -> int | None:
        return self._read().canary()

    def newest_candidate(self) -> int | None:
        """The newest version the gate passed that was never rolled out (what a scheduled
        rollout and `materialize --candidate` take), or None."""
        candidates = [r.version for r in self.records() if r.state == VersionState.CANDIDATE]
        return max(candidates, default=None)

    def serving(self) -> set[int]:
        """Production, previous production and canary: what retention never touches."""
        return self._read().serving()

    def forget(self, version: int) -> None:
        """Remove a record (retention, after its artifacts are gone); unknown is a no-op."""

        def change(state: State) -> tuple[None, list[dict[str, Any]]]:
            if version in state.serving():
                raise RegistryError(
                    f"version {version} is serving (production, previous production or "
                    "canary); it cannot be forgotten"
                )
            if version not in state.versions:
                return None, []
            before = state.versions.pop(version).state.value
            return None, [
                audit_entry(version, "forget", before, None, "forgotten (artifacts removed)")
            ]

        self._mutate(change)

    def retire_unless_serving(self, version: int, reason: str) -> bool:
        """Retire ``version`` in one atomic step unless it is serving (False then); an
        unregistered version is left unregistered (True). Retention's first step."""

        def change(state: State) -> tuple[bool, list[dict[str, Any]]]:
            record = state.versions.get(version)
            if version in state.serving():
                return False, []
            if record is None or record.state is VersionState.RETIRED:
                return True, []
            return True, [move(state, version, VersionState.RETIRED, reason)]

        return self._mutate(change)

    def adopt(self, version: int, reason: str) -> int:
        """Make ``version`` production unless one is recorded (atomic); return production."""

        def change(state: State) -> tuple[int, list[dict[str, Any]]]:
            if state.production is not None:
                return state.production, []
            record = state.versions.get(version)
            if record is not None and record.state not in (
                VersionState.CANDIDATE,
                VersionState.CANARY,
            ):
                raise RegistryError(f"version {version} is {record.state}; not adopted")
            entry = move(state, version, VersionState.PRODUCTION, reason)
            state.production = version
            return version, [entry]

        return self._mutate(change)

    @contextlib.contextmanager
    def lock(self, name: str, ttl_s: float, heartbeat: bool = True) -> Iterator[Lock]:
        """Hold the named lock for the block; raises ``LockHeld`` if another holder has it.

        A heartbeat thread refreshes it every ``ttl_s / 3`` (``heartbeat=False``: the holder
        calls ``Lock.refresh()`` itself), so a holder that dies (kill -9) blocks the next
        one for at most ``ttl_s``; it is released when the block exits in any way (an
        exception, KeyboardInterrupt, SIGTERM: see ``sigterm_as_exit``). Call
        ``Lock.check()`` before each action that needs it: it raises ``LockLost`` once
        another holder took it."""
        if not name.replace("-", "").replace("_", "").isalnum() or ttl_s <= 0:
            raise RegistryError(f"lock {name!r}: names are [A-Za-z0-9_-], ttl_s > 0")
        token = secrets.token_hex(8)
        with sigterm_as_exit():
            held = Lock(self, name, token, ttl_s, self._take_lock(name, token, ttl_s))
            if heartbeat:
                held.start_heartbeat()
            try:
                yield held
            finally:
                held.stop_heartbeat()
                try:
                    self._release_lock(name, token)
                except RegistryError as error:  # e.g. an outage: it expires on its own
                    log.warning("lock %r not released (%s): it expires in %g s", name, error, ttl_s)
