"""What the registry stores: version states and their allowed moves, records, the audit
entries, and the errors a refused change raises."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from core.errors import CascadeError

T = TypeVar("T")
HOLDER = f"{socket.gethostname()}:{os.getpid()}"  # who changes the registry, in audit entries


class VersionState(StrEnum):
    CANDIDATE = "candidate"
    REJECTED = "rejected"
    CANARY = "canary"
    PRODUCTION = "production"
    RETIRED = "retired"


ALLOWED: dict[VersionState, frozenset[VersionState]] = {
    VersionState.CANDIDATE: frozenset(
        {VersionState.CANARY, VersionState.PRODUCTION, VersionState.RETIRED}
    ),
    VersionState.CANARY: frozenset({VersionState.PRODUCTION, VersionState.RETIRED}),
    VersionState.PRODUCTION: frozenset(),  # retired only by promoting another version
    VersionState.RETIRED: frozenset({VersionState.PRODUCTION}),  # previous production only
    VersionState.REJECTED: frozenset({VersionState.RETIRED}),
}


class RegistryError(CascadeError):
    """A refused transition, an unknown version, an unreadable registry."""


class RegistryUnavailable(RegistryError):
    """The registry's store cannot be reached (connection refused, timed out): a pause,
    not a verdict; the same call may succeed once it is back."""


class LockHeld(RegistryError):
    """Another holder has the lock (the message says who and until when)."""


class LockLost(LockHeld):
    """This holder's lock expired and another holder took it: it must stop acting."""


@dataclass
class VersionRecord:
    """One version's state, its validation summary and every change it went through."""

    version: int
    state: VersionState
    created_at: float
    updated_at: float
    verdict: dict[str, Any] | None  # {"verdict": "pass"|"fail", "failed_checks": [...], ...}
    history: list[dict[str, Any]] = field(default_factory=list)  # {at, from, to, reason}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VersionRecord:
        return cls(**{**data, "state": VersionState(data["state"])})


@dataclass
class State:
    versions: dict[int, VersionRecord] = field(default_factory=dict)
    production: int | None = None
    previous_production: int | None = None
    locks: dict[str, dict[str, Any]] = field(default_factory=dict)  # FileRegistry only

    @classmethod
    def parse(cls, raw: str | bytes | None, where: str) -> State:
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
            return cls(
                {int(v): VersionRecord.from_json(r) for v, r in data["versions"].items()},
                data.get("production"),
                data.get("previous_production"),
                data.get("locks", {}),
            )
        except (ValueError, KeyError, TypeError) as error:
            raise RegistryError(f"{where}: unreadable registry ({error!r})") from None

    def dump(self) -> str:
        return json.dumps(
            {
                "versions": {str(v): asdict(r) for v, r in sorted(self.versions.items())},
                "production": self.production,
                "previous_production": self.previous_production,
                "locks": self.locks,
            },
            sort_keys=True,
        )

    def canary(self) -> int | None:
        return next((v for v, r in self.versions.items() if r.state is VersionState.CANARY), None)

    def serving(self) -> set[int]:
        """Versions no cleanup may touch: production, previous production, canary."""
        return {v for v in (self.production, self.previous_production, self.canary()) if v}


Change = Callable[[State], tuple[T, list[dict[str, Any]]]]  # -> (result, audit entries)


def audit_entry(
    version: int, event: str, before: str | None, to: str | None, reason: str
) -> dict[str, Any]:
    """One audit log entry."""
    return {
        "at": time.time(),
        "version": version,
        "event": event,
        "from": before,
        "to": to,
        "reason": reason,
        "by": HOLDER,
    }


def move(
    state: State, version: int, to: VersionState, reason: str, event: str = "transition"
) -> dict[str, Any]:
    """Put ``version`` (new or recorded) in state ``to``; return the audit entry."""
    now = time.time()
    record = state.versions.get(version)
    if record is None:
        record = state.versions[version] = VersionRecord(version, to, now, now, None)
        before = None
    else:
        before = record.state.value
    record.state, record.updated_at = to, now
    record.history.append({"at": now, "from": before, "to": to.value, "reason": reason})
    return audit_entry(version, event, before, to.value, reason)


def check_verdict(version: int, verdict: Any) -> dict[str, Any]:
    if not isinstance(version, int) or version < 1:
        raise RegistryError(f"version {version!r}: versions are integers >= 1")
    if not isinstance(verdict, dict) or verdict.get("verdict") not in ("pass", "fail"):
        raise RegistryError(
            f"version {version}: a verdict is a dict with 'verdict' 'pass' or 'fail', "
            f"got {verdict!r}"
        )
    try:
        normal: dict[str, Any] = json.loads(json.dumps(verdict))  # as it will read back
    except (TypeError, ValueError) as error:
        raise RegistryError(f"version {version}: verdict is not JSON ({error})") from None
    return normal
