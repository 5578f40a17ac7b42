"""The version registry: the one place that says each exported version's state.

Transitions (anything else raises ``RegistryError`` naming the version and both states)::

    register, verdict "pass" or forced ..... (new) -> candidate
    register, verdict "fail" ............... (new) -> rejected
    register again, another verdict ........ candidate <-> rejected (the gate ran again / --force)
    candidate ............................... -> canary | production | retired
    canary .................................. -> production | retired (rolled back)
    production .............................. -> retired, only by promoting another version:
                                                 the old production becomes previous_production
    retired ................................. -> production, only the previous production
                                                 (instant rollback)
    rejected ................................ -> retired

A transition to the state a version is already in is a no-op (steps are safe to run twice);
at most one version is canary at a time. A rejected version reaches canary only by being
registered again with a forced verdict (it becomes a candidate, and the audit log says why).

Storage, one JSON document per registry (records, production, previous production):
``RedisRegistry`` keeps it in ``{ns}:registry:state`` (changed in WATCH/MULTI transactions,
so every gateway replica and job sees one order of changes), the audit log in the stream
``{ns}:registry:audit`` and each lock in ``{ns}:registry:lock:{name}`` (expiring in Redis).
``FileRegistry`` keeps it in ``<artifacts>/registry.json`` (changed under an ``fcntl`` lock,
replaced atomically), the audit log in ``registry.audit.jsonl`` beside it, and its locks in
the document (a lock expires after its ttl, or as soon as its holder's pid on this host is dead).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import signal
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from core.errors import CascadeError
from core.export.repository import complete_versions
from services.util.redis_client import LazyRedis

if TYPE_CHECKING:
    from services.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")
AUDIT_MAX_LEN = 100_000  # Redis audit stream bound (XADD MAXLEN ~)
HOLDER = f"{socket.gethostname()}:{os.getpid()}"


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
class _State:
    versions: dict[int, VersionRecord] = field(default_factory=dict)
    production: int | None = None
    previous_production: int | None = None
    locks: dict[str, dict[str, Any]] = field(default_factory=dict)  # FileRegistry only

    @classmethod
    def parse(cls, raw: str | bytes | None, where: str) -> _State:
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


Change = Callable[[_State], tuple[T, list[dict[str, Any]]]]  # -> (result, audit entries)


def _entry(
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


def _move(
    state: _State, version: int, to: VersionState, reason: str, event: str = "transition"
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
    return _entry(version, event, before, to.value, reason)


def _check_verdict(version: int, verdict: Any) -> dict[str, Any]:
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


class Lock:
    """A held lock, kept alive by a heartbeat thread that refreshes it every ``ttl_s / 3``
    while the holder works (a long training phase needs no refresh calls); a holder that
    dies frees it within ``ttl_s``. When a refresh finds that another holder took the lock
    (it expired, e.g. the holder was frozen longer than ``ttl_s``), the lock is *lost*:
    ``check()`` raises ``LockLost`` and the holder must stop acting. A refresh that cannot
    reach the store (an outage) is retried: nobody else can take the lock there meanwhile."""

    def __init__(self, registry: Registry, name: str, token: str, ttl_s: float, until: float):
        self.registry, self.name, self.token, self.ttl_s = registry, name, token, ttl_s
        self.holder, self.until = HOLDER, until
        self.lost: LockLost | None = None
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._refreshing = threading.Lock()

    def check(self) -> None:
        """Raise ``LockLost`` when the heartbeat found the lock taken by another holder
        (no I/O: call it before every action that needs the lock)."""
        if self.lost is not None:
            raise self.lost

    def refresh(self) -> None:
        """Extend the lock by its ttl now. Raises ``LockLost`` (a ``LockHeld``) when another
        holder has taken it, ``RegistryError`` when the store cannot be reached."""
        self.check()
        with self._refreshing:
            try:
                self.until = self.registry._refresh_lock(self.name, self.token, self.ttl_s)
            except LockLost:
                raise
            except LockHeld as error:
                self.lost = LockLost(f"{error}: this holder lost it and stops")
                raise self.lost from None

    def start_heartbeat(self) -> None:
        self._thread = threading.Thread(
            target=self._beat, name=f"lock-{self.name}-heartbeat", daemon=True
        )
        self._thread.start()

    def stop_heartbeat(self) -> None:
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(5.0, self.ttl_s))
        self._thread = None

    def _beat(self) -> None:
        failing = False
        while not self._stopped.wait(self.ttl_s / 3):
            try:
                self.refresh()
            except LockLost as error:
                log.error("%s", error)
                return
            except Exception as error:  # unreachable store: retried at the next beat
                if not failing:  # the holder logs the outage itself
                    log.info("lock %r: cannot refresh (%s); retrying", self.name, error)
                failing = True
            else:
                if failing:
                    log.info("lock %r refreshed again", self.name)
                failing = False


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """While a lock is held by the main thread of a process that keeps SIGTERM's default
    (die at once), make SIGTERM raise ``SystemExit``: the ``finally`` blocks run and the
    lock is released instead of blocking the next holder for its ttl."""
    install = (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    )
    if install:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        yield
    finally:
        if install:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


class Registry(ABC):
    """The contract; backends provide storage (``_read``, ``_mutate``), audit and locks."""

    @abstractmethod
    def _read(self) -> _State: ...

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
        verdict = _check_verdict(version, verdict)
        forced = bool(verdict.get("forced"))
        to = (
            VersionState.CANDIDATE
            if verdict["verdict"] == "pass" or forced
            else VersionState.REJECTED
        )
        reason = f"validation: {verdict['verdict']}" + (" (forced)" if forced else "")

        def change(state: _State) -> tuple[VersionRecord, list[dict[str, Any]]]:
            record = state.versions.get(version)
            if record is not None and record.verdict == verdict:
                return record, []
            if record is None:
                entry = _move(state, version, to, reason, "register")
                state.versions[version].verdict = verdict
                return state.versions[version], [entry]
            if record.verdict is None:  # adopted without one: record it, state unchanged
                record.verdict = verdict
                state_now = record.state.value
                return record, [_entry(version, "register", state_now, state_now, reason)]
            if record.state not in (VersionState.CANDIDATE, VersionState.REJECTED):
                raise RegistryError(
                    f"version {version} is {record.state}: its verdict can no longer change"
                )
            record.verdict = verdict
            return record, [_move(state, version, to, f"re-{reason}", "register")]

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

        def change(state: _State) -> tuple[VersionRecord, list[dict[str, Any]]]:
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
                    entries.append(_move(state, old, VersionState.RETIRED, why))
                    state.previous_production = old
                state.production = version
            entries.append(_move(state, version, to, reason))
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

        def change(state: _State) -> tuple[None, list[dict[str, Any]]]:
            if version in state.serving():
                raise RegistryError(
                    f"version {version} is serving (production, previous production or "
                    "canary); it cannot be forgotten"
                )
            if version not in state.versions:
                return None, []
            before = state.versions.pop(version).state.value
            return None, [_entry(version, "forget", before, None, "forgotten (artifacts removed)")]

        self._mutate(change)

    def retire_unless_serving(self, version: int, reason: str) -> bool:
        """Retire ``version`` in one atomic step unless it is serving (False then); an
        unregistered version is left unregistered (True). Retention's first step."""

        def change(state: _State) -> tuple[bool, list[dict[str, Any]]]:
            record = state.versions.get(version)
            if version in state.serving():
                return False, []
            if record is None or record.state is VersionState.RETIRED:
                return True, []
            return True, [_move(state, version, VersionState.RETIRED, reason)]

        return self._mutate(change)

    def adopt(self, version: int, reason: str) -> int:
        """Make ``version`` production unless one is recorded (atomic); return production."""

        def change(state: _State) -> tuple[int, list[dict[str, Any]]]:
            if state.production is not None:
                return state.production, []
            record = state.versions.get(version)
            if record is not None and record.state not in (
                VersionState.CANDIDATE,
                VersionState.CANARY,
            ):
                raise RegistryError(f"version {version} is {record.state}; not adopted")
            entry = _move(state, version, VersionState.PRODUCTION, reason)
            state.production = version
            return version, [entry]

        return self._mutate(change)

    @contextlib.contextmanager
    def lock(self, name: str, ttl_s: float, heartbeat: bool = True) -> Iterator[Lock]:
        """Hold the named lock for the block; raises ``LockHeld`` if another holder has it.

        A heartbeat thread refreshes it every ``ttl_s / 3`` (``heartbeat=False``: the holder
        calls ``Lock.refresh()`` itself), so a holder that dies (kill -9) blocks the next
        one for at most ``ttl_s``; it is released when the block exits in any way (an
        exception, KeyboardInterrupt, SIGTERM: see ``_sigterm_as_exit``). Call
        ``Lock.check()`` before each action that needs it: it raises ``LockLost`` once
        another holder took it."""
        if not name.replace("-", "").replace("_", "").isalnum() or ttl_s <= 0:
            raise RegistryError(f"lock {name!r}: names are [A-Za-z0-9_-], ttl_s > 0")
        token = secrets.token_hex(8)
        with _sigterm_as_exit():
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


def _held_message(name: str, holder: dict[str, Any]) -> str:
    until = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(float(holder.get("until", 0))))
    return f"lock {name!r} is held by {holder.get('holder', '?')} until {until}"


# Compare-and-set of a lock key: extend it when it is ours or free; else return the holder.
_REFRESH = """
local held = redis.call('GET', KEYS[1])
if held and cjson.decode(held)['token'] ~= ARGV[1] then return held end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return false
"""
_RELEASE = """
local held = redis.call('GET', KEYS[1])
if held and cjson.decode(held)['token'] == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisRegistry(LazyRedis, Registry):
    """The registry in Redis (sync redis-py): what every replica and job reads."""

    decode_responses = True

    def __init__(self, url: str, namespace: str = "cascade", timeout_s: float = 5.0) -> None:
        self.url, self.namespace, self.timeout_s = url, namespace, timeout_s
        self.state_key = f"{namespace}:registry:state"
        self.audit_key = f"{namespace}:registry:audit"

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import RedisError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        from core.redact import redact_url

        try:
            yield
        except (RedisConnectionError, RedisTimeoutError) as error:
            raise RegistryUnavailable(f"registry at {redact_url(self.url)}: {error}") from None
        except RedisError as error:
            raise RegistryError(f"registry at {redact_url(self.url)}: {error}") from None

    def _read(self) -> _State:
        with self._errors():
            raw = self.client.get(self.state_key)
        return _State.parse(raw, self.state_key)

    def _mutate(self, change: Change[T]) -> T:
        from redis.exceptions import WatchError

        with self._errors(), self.client.pipeline() as pipe:
            while True:  # optimistic: WATCH the state, change it, EXEC unless it changed
                try:
                    pipe.watch(self.state_key)
                    state = _State.parse(pipe.get(self.state_key), self.state_key)
                    before = state.dump()
                    result, entries = change(state)
                    pipe.multi()
                    if state.dump() != before:
                        pipe.set(self.state_key, state.dump())
                    for entry in entries:
                        pipe.xadd(
                            self.audit_key,
                            {"entry": json.dumps(entry)},
                            maxlen=AUDIT_MAX_LEN,
                            approximate=True,
                        )
                    pipe.execute()
                    return result
                except WatchError:
                    continue

    def audit(self, count: int = 100) -> list[dict[str, Any]]:
        with self._errors():
            rows: Any = self.client.xrevrange(self.audit_key, count=count)
        return [json.loads(fields["entry"]) for _, fields in reversed(rows)]

    def _lock_key(self, name: str) -> str:
        return f"{self.namespace}:registry:lock:{name}"

    def _lock_value(self, token: str, ttl_s: float) -> tuple[str, float]:
        until = time.time() + ttl_s
        return json.dumps({"token": token, "holder": HOLDER, "until": until}), until

    def _take_lock(self, name: str, token: str, ttl_s: float) -> float:
        for _ in range(3):  # the holder's key may expire between SET NX and GET
            value, until = self._lock_value(token, ttl_s)
            with self._errors():
                if self.client.set(self._lock_key(name), value, nx=True, px=int(ttl_s * 1000)):
                    return until
                held = self.client.get(self._lock_key(name))
            if held is not None:
                raise LockHeld(_held_message(name, json.loads(held)))
        raise LockHeld(f"lock {name!r} changed hands three times while taking it")

    def _refresh_lock(self, name: str, token: str, ttl_s: float) -> float:
        value, until = self._lock_value(token, ttl_s)
        with self._errors():
            held = self.client.eval(
                _REFRESH, 1, self._lock_key(name), token, value, int(ttl_s * 1000)
            )
        if held:
            raise LockHeld(_held_message(name, json.loads(held)))
        return until

    def _release_lock(self, name: str, token: str) -> None:
        with self._errors():
            self.client.eval(_RELEASE, 1, self._lock_key(name), token)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class FileRegistry(Registry):
    """The registry in a JSON file beside the export (the embedded stack, without Redis)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.audit_path = self.path.with_name(f"{self.path.stem}.audit.jsonl")
        self.lock_path = self.path.with_name(f"{self.path.name}.lock")

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.lock_path.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _read(self) -> _State:
        try:
            raw = self.path.read_text()
        except FileNotFoundError:
            return _State()
        return _State.parse(raw, str(self.path))

    def _mutate(self, change: Change[T]) -> T:
        with self._exclusive():
            state = self._read()
            before = state.dump()
            result, entries = change(state)
            if state.dump() != before:
                temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
                with temporary.open("w") as handle:
                    handle.write(state.dump())
                    handle.flush()
                    os.fsync(handle.fileno())
                temporary.replace(self.path)
            if entries:
                with self.audit_path.open("a") as handle:
                    handle.writelines(json.dumps(e) + "\n" for e in entries)
                    handle.flush()
                    os.fsync(handle.fileno())
        return result

    def audit(self, count: int = 100) -> list[dict[str, Any]]:
        try:
            with self.audit_path.open() as handle:
                return [json.loads(line) for line in deque(handle, maxlen=count)]
        except FileNotFoundError:
            return []

    @staticmethod
    def _held_by_other(held: dict[str, Any] | None, token: str) -> bool:
        if held is None or held["token"] == token or held["until"] <= time.time():
            return False
        return not (held["host"] == socket.gethostname() and not _pid_alive(held["pid"]))

    def _set_lock(self, name: str, token: str, ttl_s: float) -> float:
        def change(state: _State) -> tuple[float, list[dict[str, Any]]]:
            held = state.locks.get(name)
            if self._held_by_other(held, token):
                assert held is not None
                raise LockHeld(_held_message(name, held))
            until = time.time() + ttl_s
            state.locks[name] = {
                "token": token,
                "holder": HOLDER,
                "until": until,
                "host": socket.gethostname(),
                "pid": os.getpid(),
            }
            return until, []

        return self._mutate(change)

    _take_lock = _set_lock
    _refresh_lock = _set_lock

    def _release_lock(self, name: str, token: str) -> None:
        def change(state: _State) -> tuple[None, list[dict[str, Any]]]:
            if state.locks.get(name, {}).get("token") == token:
                del state.locks[name]
            return None, []

        self._mutate(change)


def make_registry(settings: Settings) -> Registry:
    """Redis when the settings name one (shared by every replica), else the file."""
    if settings.redis.durable:
        return RedisRegistry(settings.redis.durable, settings.redis.namespace)
    return FileRegistry(settings.artifacts / "registry.json")


def adopt_served(registry: Registry, artifacts: Path) -> int | None:
    """First deploy: with no production recorded, the newest complete version on disk that is
    not rejected or retired (what an unpinned gateway serves) becomes production, reason
    "adopted: first deploy". Returns the production version (None: nothing to adopt)."""
    production = registry.production()
    if production is not None:
        return production
    for version in reversed(complete_versions(artifacts)):
        record = registry.get(version)
        if record is None or record.state in (VersionState.CANDIDATE, VersionState.CANARY):
            return registry.adopt(version, "adopted: first deploy")
    return None
