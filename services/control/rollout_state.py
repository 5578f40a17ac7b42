"""What a rollout knows between two looks, persisted so a killed controller resumes.

``RolloutRecord`` holds the rollout's identity, step, status, the stream cursors it has read
up to, the per-arm counts built from the impression and feedback streams, and the
sequential test's state. ``RolloutLog`` stores it (Redis ``{ns}:rollout:state``, or a JSON
file for the embedded stack) and appends every decision to an audit log (Redis stream
``{ns}:rollout:audit``, or a JSON-lines file).
"""

from __future__ import annotations

import json
import os
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Literal

import numpy as np
import redis
from pydantic import BaseModel, Field

from services.control.analysis import ArmStats

Status = Literal["running", "promoted", "rolled_back"]

# Latency histogram of an arm: geometric bucket bounds from 0.1 ms to 100 s.
LATENCY_BOUNDS_MS = np.geomspace(0.1, 100_000, 121)


class ArmCounts(BaseModel):
    """Counts of one arm, built from the logged impression sets and feedback."""

    requests: int = 0
    errors: int = 0
    degraded: int = 0
    impressions: int = 0
    clicks: int = 0
    hits: int = 0
    latency_buckets: list[int] = Field(default_factory=lambda: [0] * (len(LATENCY_BOUNDS_MS) + 1))

    def add_latencies(self, latencies_ms: np.ndarray) -> None:
        buckets = np.searchsorted(LATENCY_BOUNDS_MS, latencies_ms)
        counts = np.bincount(buckets, minlength=len(self.latency_buckets))
        self.latency_buckets = (np.asarray(self.latency_buckets) + counts).tolist()

    def p99_ms(self) -> float | None:
        """The 99th percentile, as the upper bound of its bucket (None: no requests)."""
        total = sum(self.latency_buckets)
        if total == 0:
            return None
        index = int(np.searchsorted(np.cumsum(self.latency_buckets), 0.99 * total))
        return float(LATENCY_BOUNDS_MS[min(index, len(LATENCY_BOUNDS_MS) - 1)])

    def stats(self) -> ArmStats:
        return ArmStats(
            requests=self.requests,
            errors=self.errors,
            degraded=self.degraded,
            impressions=self.impressions,
            clicks=self.clicks,
            hits=self.hits,
            p99_ms=self.p99_ms(),
        )


class RolloutRecord(BaseModel):
    """One rollout of ``version`` against ``production``."""

    id: str
    version: int
    production: int
    status: Status = "running"
    step: int = 0  # index into weights
    weights: list[float]
    forced: bool = False
    started_at: float = Field(default_factory=time.time)
    step_started_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    reason: str = ""
    cursors: dict[str, str] = Field(
        default_factory=lambda: {"impressions": "0-0", "feedback": "0-0"}
    )
    arms: dict[str, ArmCounts] = Field(default_factory=dict)  # "control" / "canary"
    step_requests: list[int] = Field(default_factory=list)  # requests seen in each step
    sequential: dict[str, Any] = Field(default_factory=dict)
    looks: int = 0
    last_decision: dict[str, Any] | None = None

    @property
    def weight(self) -> float:
        return self.weights[self.step]

    def arm(self, name: str) -> ArmCounts:
        return self.arms.setdefault(name, ArmCounts())

    def effective_weight(self) -> float:
        """The canary share expected over all requests so far, given each step's weight and
        traffic: what the sample-ratio test compares the observed split against."""
        seen = self.step_requests + [0] * (len(self.weights) - len(self.step_requests))
        total = sum(seen[: self.step + 1])
        if total == 0:
            return self.weight
        return sum(w * n for w, n in zip(self.weights, seen, strict=False)) / total


class RolloutLog(ABC):
    """Where the rollout record and its audit trail live."""

    @abstractmethod
    def load(self) -> RolloutRecord | None: ...

    @abstractmethod
    def save(self, record: RolloutRecord) -> None: ...

    @abstractmethod
    def append(self, entry: dict[str, Any]) -> None:
        """Add one entry (a decision, a transition) to the audit trail."""

    @abstractmethod
    def audit(self, count: int = 50) -> list[dict[str, Any]]:
        """The newest ``count`` audit entries, oldest first."""

    def close(self) -> None:
        return None


class RedisRolloutLog(RolloutLog):
    def __init__(self, url: str, namespace: str = "cascade", timeout_s: float = 2.0) -> None:
        self.client = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self.key, self.stream = f"{namespace}:rollout:state", f"{namespace}:rollout:audit"

    def load(self) -> RolloutRecord | None:
        raw = self.client.get(self.key)
        return None if raw is None else RolloutRecord.model_validate_json(raw)

    def save(self, record: RolloutRecord) -> None:
        record.updated_at = time.time()
        self.client.set(self.key, record.model_dump_json())

    def append(self, entry: dict[str, Any]) -> None:
        payload = {"entry": json.dumps(entry, sort_keys=True)}
        self.client.xadd(self.stream, payload, maxlen=100_000, approximate=True)  # type: ignore[arg-type]

    def audit(self, count: int = 50) -> list[dict[str, Any]]:
        entries: Any = self.client.xrevrange(self.stream, count=count)
        return [json.loads(fields[b"entry"]) for _, fields in reversed(entries)]

    def close(self) -> None:
        self.client.close()


class FileRolloutLog(RolloutLog):
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path, self.trail = directory / "state.json", directory / "audit.jsonl"

    def load(self) -> RolloutRecord | None:
        try:
            return RolloutRecord.model_validate_json(self.path.read_text())
        except FileNotFoundError:
            return None

    def save(self, record: RolloutRecord) -> None:
        record.updated_at = time.time()
        self.directory.mkdir(parents=True, exist_ok=True)
        staging = self.path.with_suffix(".tmp")
        staging.write_text(record.model_dump_json())
        with staging.open() as handle:
            os.fsync(handle.fileno())
        staging.replace(self.path)

    def append(self, entry: dict[str, Any]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with self.trail.open("a") as out:
            out.write(json.dumps(entry, sort_keys=True) + "\n")

    def audit(self, count: int = 50) -> list[dict[str, Any]]:
        if not self.trail.is_file():
            return []
        lines = self.trail.read_text().splitlines()[-count:]
        return [json.loads(line) for line in lines if line.strip()]


def make_rollout_log(redis_url: str | None, namespace: str, artifacts: Path) -> RolloutLog:
    if redis_url:
        return RedisRolloutLog(redis_url, namespace)
    return FileRolloutLog(artifacts / "rollout")
