"""The desired serving state every gateway replica follows: production version, canary
version and its traffic weight, the rollout step, and a revision that increases with every
change.

Written only by the rollout controller (and the manual ``cascade rollback`` / ``promote``),
read by every gateway every second or so. It lives in Redis (``{ns}:rollout:desired``) so
that all replicas see one state; the embedded stack without Redis keeps it in a JSON file
beside the artifacts. Writes are compare-and-set on the revision, so two writers can never
overwrite each other's change unseen. A write to Redis is also published (channel
``{ns}:rollout:desired:changed``), so that a follower waiting between its ticks
(``wait_for_change``) applies it at once; the poll stays, for a missed message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, model_validator

from core.errors import CascadeError
from services.util.redis_client import LazyRedis, async_client

log = logging.getLogger(__name__)

KEY = "rollout:desired"

# Sets KEYS[1] to ARGV[1] only when its revision is ARGV[2] (0: the key must not exist),
# and publishes ARGV[1] on channel ARGV[3].
_COMPARE_AND_SET = """
local current = redis.call('GET', KEYS[1])
local expected = tonumber(ARGV[2])
if current then
  if cjson.decode(current)['revision'] ~= expected then return 0 end
elseif expected ~= 0 then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[3], ARGV[1])
return 1
"""


class DesiredStateConflict(CascadeError):
    """Someone else changed the desired state since it was read."""


class DesiredState(BaseModel):
    """What the fleet should serve."""

    production: int = Field(ge=1, description="The version every user gets by default.")
    canary: int | None = Field(None, ge=1, description="The version under test, if any.")
    canary_weight: float = Field(0.0, ge=0, le=1, description="Share of users on the canary.")
    step: int = Field(0, ge=0, description="Rollout step the weight belongs to.")
    revision: int = Field(0, ge=0, description="Increases with every write.")
    updated_at: float = Field(default_factory=time.time)
    reason: str = Field("", description="Why it changed (shown in status and logs).")
    assignment_salt: str = Field(
        "",
        max_length=64,
        description="Mixed into the user hash that picks canary users: one per rollout.",
    )

    @model_validator(mode="after")
    def _canary_differs(self) -> DesiredState:
        if self.canary is not None and self.canary == self.production:
            raise ValueError("the canary must differ from the production version")
        if self.canary is None and self.canary_weight > 0:
            raise ValueError("a canary weight needs a canary version")
        return self

    @property
    def weight_percent(self) -> float:
        return self.canary_weight * 100

    @property
    def versions(self) -> list[int]:
        """The versions to have loaded: production, and the canary when there is one."""
        return sorted({self.production, *([self.canary] if self.canary else [])})

    def next(self, **changes: object) -> DesiredState:
        """The state after a change: the given fields, one more revision, a new time."""
        data = self.model_dump() | changes
        data.update(revision=self.revision + 1, updated_at=time.time())
        return DesiredState.model_validate(data)


class DesiredStateStore(ABC):
    """Where the desired state lives (Redis for a fleet, a file for the embedded stack)."""

    @abstractmethod
    def read(self) -> DesiredState | None:
        """The current state, or None when none was ever written."""

    @abstractmethod
    def _swap(self, payload: str, expected_revision: int) -> bool: ...

    def write(self, state: DesiredState, expected_revision: int) -> DesiredState:
        """Store ``state`` if the stored revision is still ``expected_revision`` (0: none
        stored); raise DesiredStateConflict otherwise."""
        if not self._swap(state.model_dump_json(), expected_revision):
            raise DesiredStateConflict(
                f"the desired state changed since revision {expected_revision}: read it again"
            )
        return state

    @abstractmethod
    def report(self, replica: str, status: dict, ttl_s: float) -> None:
        """A gateway replica says what it applied (kept for ``ttl_s``)."""

    @abstractmethod
    def reports(self) -> list[dict]:
        """The live replicas' last reports."""

    @abstractmethod
    def remove_report(self, replica: str) -> None:
        """A stopping replica withdraws its report (it is no longer live)."""

    async def wait_for_change(self, timeout_s: float) -> None:
        """Return when a write of the desired state is announced, or after ``timeout_s``
        (what a follower waits on between ticks). Without announcements: the timeout."""
        await asyncio.sleep(timeout_s)

    async def stop_watching(self) -> None:
        """Close what ``wait_for_change`` opened (in the event loop that waited)."""
        return None

    def close(self) -> None:
        return None


def _parse(raw: str | bytes | None, where: str) -> DesiredState | None:
    if raw is None:
        return None
    try:
        return DesiredState.model_validate_json(raw)
    except ValidationError as error:
        raise CascadeError(f"the desired state in {where} is invalid: {error}") from None


class RedisDesiredState(LazyRedis, DesiredStateStore):
    def __init__(self, url: str, namespace: str = "cascade", timeout_s: float = 0.5) -> None:
        self.url, self.key = url, f"{namespace}:{KEY}"
        self.channel = f"{self.key}:changed"
        self.timeout_s = timeout_s
        self._watch: Any = None  # an asyncio pub/sub subscribed to ``channel``, once waited
        self._watch_failed = False

    def read(self) -> DesiredState | None:
        return _parse(self.client.get(self.key), f"Redis key {self.key}")

    def _swap(self, payload: str, expected_revision: int) -> bool:
        arguments = (payload, expected_revision, self.channel)
        return bool(self.client.eval(_COMPARE_AND_SET, 1, self.key, *arguments))

    async def wait_for_change(self, timeout_s: float) -> None:
        """Wait for a message on ``channel`` (subscribed at the first wait, on its own
        connection); when Redis cannot be subscribed to, sleep out the timeout (the caller
        polls) and subscribe again at the next wait."""
        deadline = time.monotonic() + timeout_s
        try:
            if self._watch is None:
                client = async_client(self.url, socket_connect_timeout=self.timeout_s)
                self._watch = client.pubsub(ignore_subscribe_messages=True)
                await self._watch.subscribe(self.channel)
                self._watch_failed = False
            while (left := deadline - time.monotonic()) > 0:
                if await self._watch.get_message(timeout=left) is not None:
                    return
        except Exception as error:
            if not self._watch_failed:
                log.warning("desired state changes not announced (%r): polling only", error)
            self._watch_failed = True
            await self.stop_watching()
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))

    async def stop_watching(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            try:
                await watch.aclose()
                await watch.connection_pool.disconnect()
            except Exception as error:  # closing a broken connection
                log.debug("closing the desired-state subscription: %r", error)

    def report(self, replica: str, status: dict, ttl_s: float) -> None:
        self.client.set(f"{self.key}:replica:{replica}", json.dumps(status), px=int(ttl_s * 1000))

    def reports(self) -> list[dict]:
        keys = sorted(self.client.scan_iter(f"{self.key}:replica:*", count=1000))
        values = self.client.mget(keys) if keys else []
        return [json.loads(v) for v in values if v is not None]

    def remove_report(self, replica: str) -> None:
        self.client.delete(f"{self.key}:replica:{replica}")


class FileDesiredState(DesiredStateStore):
    """A JSON file, replaced atomically (write + rename) under an exclusive lock file;
    replica reports in a ``replicas/`` directory beside it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.directory = path.parent / "replicas"

    def read(self) -> DesiredState | None:
        try:
            return _parse(self.path.read_text(), str(self.path))
        except FileNotFoundError:
            return None

    def _swap(self, payload: str, expected_revision: int) -> bool:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with (self.path.parent / f".{self.path.name}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            current = self.read()
            if (current.revision if current else 0) != expected_revision:
                return False
            staging = self.path.with_suffix(".tmp")
            staging.write_text(payload)
            with staging.open() as handle:
                os.fsync(handle.fileno())
            staging.replace(self.path)
            return True

    def report(self, replica: str, status: dict, ttl_s: float) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        payload = json.dumps({"status": status, "expires": time.time() + ttl_s})
        staging = self.directory / f".{replica}.tmp"
        staging.write_text(payload)
        staging.replace(self.directory / f"{replica}.json")

    def reports(self) -> list[dict]:
        found = []
        for path in sorted(self.directory.glob("*.json")) if self.directory.is_dir() else []:
            try:
                entry = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if entry.get("expires", 0) > time.time():
                found.append(entry["status"])
        return found

    def remove_report(self, replica: str) -> None:
        (self.directory / f"{replica}.json").unlink(missing_ok=True)


def make_desired_state_store(
    redis_url: str | None, namespace: str, artifacts: Path
) -> DesiredStateStore:
    """Redis when the fleet has one, else a file beside the artifacts (embedded stack)."""
    if redis_url:
        return RedisDesiredState(redis_url, namespace)
    return FileDesiredState(artifacts / "rollout" / "desired.json")


def pin_production(settings: Any, production: int | None) -> DesiredState | None:
    """With no desired state yet, write one that serves ``production``: from then on a
    gateway (re)started unpinned serves the registry's production, never merely the newest
    export (which may be a rejected or unvalidated candidate). Returns the state in force."""
    if production is None:
        return None
    store = make_desired_state_store(
        settings.redis.durable, settings.redis.namespace, settings.artifacts
    )
    try:
        current = store.read()
        if current is not None:
            return current
        state = DesiredState(production=production, revision=1, reason="pinned to production")
        try:
            return store.write(state, expected_revision=0)
        except DesiredStateConflict:
            return store.read()
    finally:
        store.close()


def describe(state: DesiredState | None) -> str:
    if state is None:
        return "no desired state (serving what the settings say)"
    canary = (
        f", canary {state.canary} at {state.canary_weight:.0%} (step {state.step})"
        if state.canary
        else ""
    )
    return f"production {state.production}{canary}, revision {state.revision}"


def as_json(state: DesiredState | None) -> str:
    return json.dumps(None if state is None else state.model_dump(), sort_keys=True)
