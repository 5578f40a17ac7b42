"""The retrain queue: requests from the alert webhook, taken one at a time by the worker.

``offer`` enqueues a request unless the same alert group and data window was offered before
(``duplicate``) or a retrain was enqueued less than ``cooldown_s`` ago (``cooldown``), in one
atomic step. ``claim`` hands the oldest request to a worker under a lease that the worker
renews while its retrain runs; ``complete`` removes it. A worker that dies between claim and
complete stops renewing, and once the lease expires the next ``claim`` hands the same request
out again: a request is never lost to a crash.

Two backends with the same behaviour: Redis (a stream with a consumer group; pending entries
are the claimed ones, re-claimed with XAUTOCLAIM) whenever the settings name a Redis, else a
JSON file beside the retrain job's state (the embedded stack, no servers needed).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.files import write_json
from services.errors import DependencyUnavailable
from services.settings import Settings
from services.util.redis_client import LazyRedis

# Decisions of the webhook, the values of cascade_retrain_requests_total{decision}.
DECISIONS = ("enqueued", "duplicate", "cooldown", "resolved", "not_retrain")
QUEUE_FILE = "queue.json"


@dataclass(frozen=True)
class RetrainRequest:
    """One queued retrain: why (``trigger``: the alerts) and when it was enqueued."""

    id: str
    dedup_key: str
    trigger: dict[str, Any]
    enqueued_at: float


@dataclass(frozen=True)
class Offer:
    """The outcome of ``offer``: enqueued, duplicate or cooldown (and the request id)."""

    decision: str
    request_id: str | None = None


class RetrainQueue(ABC):
    """Backends implement these; both pass the same contract tests."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock

    @abstractmethod
    def offer(
        self, dedup_key: str, trigger: dict[str, Any], cooldown_s: float, dedup_ttl_s: int
    ) -> Offer:
        """Enqueue a request unless ``dedup_key`` was offered within ``dedup_ttl_s`` or a
        request was enqueued within ``cooldown_s`` (atomically)."""

    @abstractmethod
    def claim(self, consumer: str, lease_s: float) -> RetrainRequest | None:
        """The oldest request nobody holds a live lease on, now leased to ``consumer``."""

    @abstractmethod
    def renew(self, request: RetrainRequest, consumer: str) -> None:
        """Restart the lease of a claimed request (the worker is alive)."""

    @abstractmethod
    def complete(self, request: RetrainRequest) -> None:
        """Remove a request whose retrain ran to an outcome."""

    @abstractmethod
    def requests(self) -> list[RetrainRequest]:
        """Every request still queued or claimed, oldest first."""

    def close(self) -> None:  # noqa: B027 - only the Redis backend holds connections
        """Release connections."""


def _digest(dedup_key: str) -> str:
    return hashlib.sha256(dedup_key.encode()).hexdigest()[:32]


# KEYS: stream, dedup key, last-enqueued key. ARGV: now, cooldown_s, dedup_ttl_s, trigger
# JSON, dedup key text. Returns {decision, id}.
_OFFER = """
if redis.call('EXISTS', KEYS[2]) == 1 then return {'duplicate', redis.call('GET', KEYS[2])} end
local last = redis.call('GET', KEYS[3])
if last and tonumber(ARGV[1]) - tonumber(last) < tonumber(ARGV[2]) then
  return {'cooldown', ''}
end
local id = redis.call('XADD', KEYS[1], '*', 'trigger', ARGV[4], 'dedup_key', ARGV[5],
                      'enqueued_at', ARGV[1])
redis.call('SET', KEYS[2], id, 'EX', ARGV[3])
redis.call('SET', KEYS[3], ARGV[1])
return {'enqueued', id}
"""
GROUP = "retrain-workers"


class RedisRetrainQueue(LazyRedis, RetrainQueue):
    """The queue in Redis (sync redis-py): shared by every gateway replica and worker."""

    decode_responses = True

    @property
    def client(self) -> Any:  # replies decoded to str, which redis-py's stubs do not model
        return super().client

    def __init__(
        self,
        url: str,
        namespace: str = "cascade",
        timeout_s: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(clock)
        self.url, self.timeout_s = url, timeout_s
        self.stream = f"{namespace}:retrain:requests"
        self.last_key = f"{namespace}:retrain:last_enqueued"
        self.dedup_prefix = f"{namespace}:retrain:dedup:"
        self._group_ready = False

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        from redis.exceptions import RedisError

        try:
            yield
        except RedisError as error:
            raise DependencyUnavailable("retrain queue (redis)", type(error).__name__) from None

    def offer(
        self, dedup_key: str, trigger: dict[str, Any], cooldown_s: float, dedup_ttl_s: int
    ) -> Offer:
        keys = [self.stream, self.dedup_prefix + _digest(dedup_key), self.last_key]
        argv = [repr(self.clock()), cooldown_s, dedup_ttl_s, json.dumps(trigger), dedup_key]
        with self._errors():
            decision, request_id = self.client.eval(_OFFER, len(keys), *keys, *argv)
        return Offer(decision, request_id or None)

    def _ensure_group(self) -> None:
        from redis.exceptions import ResponseError

        if self._group_ready:
            return
        try:
            self.client.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise
        self._group_ready = True

    @staticmethod
    def _request(entry_id: str, fields: dict[str, str]) -> RetrainRequest:
        return RetrainRequest(
            entry_id,
            fields["dedup_key"],
            json.loads(fields["trigger"]),
            float(fields["enqueued_at"]),
        )

    def claim(self, consumer: str, lease_s: float) -> RetrainRequest | None:
        with self._errors():
            self._ensure_group()
            # a request whose worker stopped renewing its lease comes first
            _, stale, *_ = self.client.xautoclaim(
                self.stream, GROUP, consumer, min_idle_time=int(lease_s * 1000), count=1
            )
            stale = [(entry_id, fields) for entry_id, fields in stale if fields]
            if stale:
                return self._request(*stale[0])
            fresh = self.client.xreadgroup(GROUP, consumer, {self.stream: ">"}, count=1)
        for _, entries in fresh or []:
            for entry_id, fields in entries:
                return self._request(entry_id, fields)
        return None

    def renew(self, request: RetrainRequest, consumer: str) -> None:
        with self._errors():
            self.client.xclaim(self.stream, GROUP, consumer, 0, [request.id], justid=True)

    def complete(self, request: RetrainRequest) -> None:
        with self._errors(), self.client.pipeline(transaction=True) as pipe:
            pipe.xack(self.stream, GROUP, request.id)
            pipe.xdel(self.stream, request.id)
            pipe.execute()

    def requests(self) -> list[RetrainRequest]:
        with self._errors():
            entries = self.client.xrange(self.stream)
        return [self._request(entry_id, fields) for entry_id, fields in entries]


class FileRetrainQueue(RetrainQueue):
    """The queue in a JSON file under an exclusive lock (the embedded stack, one host)."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        super().__init__(clock)
        self.path = Path(path)
        self.lock_path = self.path.with_name(f"{self.path.name}.lock")

    @contextlib.contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        """The file's content under the lock; written back (atomically) when changed."""
        with self._file_errors():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = self.lock_path.open("a")
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                with self._file_errors():
                    raw = self.path.read_text() if self.path.is_file() else ""
                    state = json.loads(raw) if raw else {}
                    if not isinstance(state, dict):
                        raise ValueError("not a JSON object")
                state.setdefault("dedup", {})
                state.setdefault("last_enqueued", None)
                state.setdefault("requests", [])
                state.setdefault("next", 1)
                before = json.dumps(state, sort_keys=True)
                yield state
                if json.dumps(state, sort_keys=True) != before:
                    with self._file_errors():
                        write_json(self.path, state)
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def _file_errors(self) -> Iterator[None]:
        """A file that cannot be read, written or parsed: the queue is unavailable (503 at
        the webhook, so Alertmanager retries; exit 3 for the worker), naming the file."""
        try:
            yield
        except (OSError, ValueError) as error:
            reason = error.strerror if isinstance(error, OSError) else f"corrupt ({error})"
            raise DependencyUnavailable(f"retrain queue ({self.path})", str(reason)) from None

    def offer(
        self, dedup_key: str, trigger: dict[str, Any], cooldown_s: float, dedup_ttl_s: int
    ) -> Offer:
        now = self.clock()
        with self._state() as state:
            state["dedup"] = {k: v for k, v in state["dedup"].items() if v["until"] > now}
            earlier = state["dedup"].get(_digest(dedup_key))
            if earlier is not None:
                return Offer("duplicate", earlier["id"])
            last = state["last_enqueued"]
            if last is not None and now - last < cooldown_s:
                return Offer("cooldown")
            request_id = f"{int(now * 1000)}-{state['next']}"
            state["next"] += 1
            state["requests"].append(
                {
                    "id": request_id,
                    "dedup_key": dedup_key,
                    "trigger": trigger,
                    "enqueued_at": now,
                    "consumer": None,
                    "lease_until": None,
                }
            )
            state["dedup"][_digest(dedup_key)] = {"id": request_id, "until": now + dedup_ttl_s}
            state["last_enqueued"] = now
        return Offer("enqueued", request_id)

    @staticmethod
    def _request(entry: dict[str, Any]) -> RetrainRequest:
        return RetrainRequest(
            entry["id"], entry["dedup_key"], entry["trigger"], float(entry["enqueued_at"])
        )

    def claim(self, consumer: str, lease_s: float) -> RetrainRequest | None:
        now = self.clock()
        with self._state() as state:
            for entry in state["requests"]:
                if entry["lease_until"] is None or entry["lease_until"] <= now:
                    entry["consumer"], entry["lease_until"] = consumer, now + lease_s
                    entry["lease_s"] = lease_s
                    return self._request(entry)
        return None

    def renew(self, request: RetrainRequest, consumer: str) -> None:
        now = self.clock()
        with self._state() as state:
            for entry in state["requests"]:
                if entry["id"] == request.id:
                    entry["consumer"] = consumer
                    entry["lease_until"] = now + float(entry.get("lease_s", 0.0))

    def complete(self, request: RetrainRequest) -> None:
        with self._state() as state:
            state["requests"] = [e for e in state["requests"] if e["id"] != request.id]

    def requests(self) -> list[RetrainRequest]:
        with self._state() as state:
            return [self._request(entry) for entry in state["requests"]]


def make_retrain_queue(settings: Settings) -> RetrainQueue:
    """Redis when the settings name one (shared by replicas and workers), else the file
    ``retrain_trigger.queue_file``, by default in the retrain job's default state directory,
    ``<artifacts>/retrain/queue.json``."""
    if settings.redis.durable:
        return RedisRetrainQueue(settings.redis.durable, settings.redis.namespace)
    path = settings.retrain_trigger.queue_file
    return FileRetrainQueue(path or settings.artifacts / "retrain" / QUEUE_FILE)


@contextlib.contextmanager
def leased(
    queue: RetrainQueue, request: RetrainRequest, consumer: str, lease_s: float
) -> Iterator[None]:
    """Renew ``request``'s lease every third of ``lease_s`` while the block runs (a thread),
    so that a long retrain keeps it and a dead worker loses it."""
    import threading

    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(lease_s / 3):
            with contextlib.suppress(DependencyUnavailable):  # retried at the next tick
                queue.renew(request, consumer)

    thread = threading.Thread(target=renew, name="retrain-lease", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
