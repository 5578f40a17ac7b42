"""What a rollout knows between two looks, persisted so a killed controller resumes.

``RolloutRecord`` holds the rollout's identity, step, status, the stream cursors it has read
up to, the per-arm counts built from the impression and feedback streams, and the
sequential test's state. ``RolloutLog`` stores it (Redis ``{ns}:rollout:state``, or a JSON
file for the embedded stack), appends every decision to an audit log (Redis stream
``{ns}:rollout:audit``, or a JSON-lines file) and holds the operator's request to stop the
running rollout (``{ns}:rollout:request``, or ``request.json``), which the controller that
holds the ``rollout`` lock honours at its next look.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import zlib
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from control.rollout.analysis import ArmStats
from control.rollout.cuped import Covariates
from services.util.redis_client import sync_client

Status = Literal["running", "promoted", "rolled_back"]
Action = Literal["rollback", "promote"]

# Latency histogram of an arm: geometric bucket bounds from 0.1 ms to 100 s.
LATENCY_BOUNDS_MS = np.geomspace(0.1, 100_000, 121)
# Users are hashed into this many clusters per arm; the KPI variance is computed between
# clusters (see ``cluster_ratio_variance``), so every user's requests and clicks stay in one.
USER_CLUSTERS = 128


# The split test's finer hash of users (a refinement of the clusters: bucket mod 128 is the
# cluster): how many requests each user made, up to collisions, whatever arm served them.
SPLIT_BUCKETS = 4096


def user_cluster(user_id: str) -> int:
    """The cluster of a user (a hash independent of the routing hash, which is salted)."""
    return zlib.crc32(user_id.encode()) % USER_CLUSTERS


def user_bucket(user_id: str) -> int:
    """The split test's bucket of a user (``user_cluster`` is this modulo 128)."""
    return zlib.crc32(user_id.encode()) % SPLIT_BUCKETS


def cluster_ratio_variance(successes: list[int], trials: list[int]) -> float | None:
    """Variance of the ratio sum(successes) / sum(trials) with clusters as the independent
    units (the linearised, cluster-robust "delta method" estimate)::

        R = X / N,  var(R) = K / (K - 1) * sum_k (x_k - R n_k)^2 / N^2

    over the K clusters with any trials. Clicks of one user, and of one request, are
    correlated (a user who likes the list clicks several items, and comes back); treating
    impressions as independent trials understates the variance and makes an A/A test fail
    too often. None with fewer than two clusters.
    """
    x = np.asarray(successes, np.float64)
    n = np.asarray(trials, np.float64)
    used = n > 0
    k, total = int(used.sum()), float(n.sum())
    if k < 2 or total <= 0:
        return None
    ratio = float(np.minimum(x, n).sum()) / total
    residual = np.minimum(x, n)[used] - ratio * n[used]
    return k / (k - 1) * float(residual @ residual) / (total * total)


class ArmCounts(BaseModel):
    """Counts of one arm, built from the logged impression sets and feedback."""

    requests: int = 0
    errors: int = 0
    degraded: int = 0
    impressions: int = 0
    clicks: int = 0
    hits: int = 0
    latency_buckets: list[int] = Field(default_factory=lambda: [0] * (len(LATENCY_BOUNDS_MS) + 1))
    # Per user cluster: requests, impressions, clicks, hits (for the clustered KPI variance).
    clusters: list[list[int]] = Field(
        default_factory=lambda: [[0] * USER_CLUSTERS for _ in range(4)]
    )

    def add_request(self, user_id: str, impressions: int) -> None:
        """One logged answer of ``impressions`` items to ``user_id``."""
        cluster = user_cluster(user_id)
        self.requests += 1
        self.impressions += impressions
        self.clusters[0][cluster] += 1
        self.clusters[1][cluster] += impressions

    def add_click(self, user_id: str, hit: bool) -> None:
        """One click attributed to this arm (``hit``: the first click on its answer)."""
        cluster = user_cluster(user_id)
        self.clicks += 1
        self.hits += hit
        self.clusters[2][cluster] += 1
        self.clusters[3][cluster] += hit

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
            ctr_variance=cluster_ratio_variance(self.clusters[2], self.clusters[1]),
            hit_rate_variance=cluster_ratio_variance(self.clusters[3], self.clusters[0]),
            latency_buckets=tuple(self.latency_buckets),
        )


class SplitCounts(BaseModel):
    """Answers the canary split of one share assigned, per arm: the sample-ratio test's data.
    Each answer carries the split that assigned it (``VersionRouter.split``), so an answer a
    replica gave while still loading the canary (everyone on production) or one whose version
    the client requested is never counted against the step's weight."""

    control: int = 0
    canary: int = 0
    # requests per user cluster: [control, canary] (for the split test's clustered variance)
    clusters: list[list[int]] = Field(
        default_factory=lambda: [[0] * USER_CLUSTERS for _ in range(2)]
    )
    # requests per user bucket, both arms together (sparse): the split's variance under the
    # hypothesis that users are assigned at the configured share (``split_test_counts``)
    buckets: dict[int, int] = Field(default_factory=dict)

    def add(self, user_id: str, canary: bool) -> None:
        cluster = user_cluster(user_id)
        if canary:
            self.canary += 1
        else:
            self.control += 1
        self.clusters[int(canary)][cluster] += 1
        bucket = user_bucket(user_id)
        self.buckets[bucket] = self.buckets.get(bucket, 0) + 1

    def bucket_counts(self) -> np.ndarray | None:
        """Requests per bucket as a dense vector; None for a split recorded without them
        (a rollout record saved before buckets were kept)."""
        if sum(self.buckets.values()) != self.control + self.canary:
            return None
        size = len(self.buckets)
        keys = np.fromiter(self.buckets.keys(), np.int64, size)
        values = np.fromiter(self.buckets.values(), np.float64, size)
        return np.bincount(keys, values, SPLIT_BUCKETS)


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
    # when every live replica had applied the step's routing (None: still loading)
    step_applied_at: float | None = None
    # each arm's requests when the step's routing was applied: what the step itself got
    step_requests: dict[str, int] = Field(default_factory=dict)
    # live replicas not converged on the step at the last look (no verdict meanwhile), and
    # since when some have been (the not_applied deadline counts from there)
    replicas_behind: list[str] = Field(default_factory=list)
    behind_since: float | None = None
    updated_at: float = Field(default_factory=time.time)
    reason: str = ""
    detail: str = ""  # what the reason measured, or the operator's words
    cursors: dict[str, str] = Field(
        default_factory=lambda: {"impressions": "0-0", "feedback": "0-0"}
    )
    arms: dict[str, ArmCounts] = Field(default_factory=dict)  # "control" / "canary"
    # by the canary share that assigned the answers ("0.05"): see SplitCounts
    splits: dict[str, SplitCounts] = Field(default_factory=dict)
    sequential: dict[str, Any] = Field(default_factory=dict)
    # CUPED (AnalysisConfig.cuped): the users each arm served and their pre-rollout sums
    covariates: Covariates | None = None
    looks: int = 0
    last_decision: dict[str, Any] | None = None

    @property
    def weight(self) -> float:
        return self.weights[self.step]

    def arm(self, name: str) -> ArmCounts:
        return self.arms.setdefault(name, ArmCounts())

    def arm_stats(self, name: str) -> ArmStats:
        """The arm's stats, carrying its users' pre-rollout CTR when CUPED is on."""
        arm = self.arm(name)
        stats = arm.stats()
        if self.covariates is None:
            return stats
        covariate = self.covariates.arm(name, arm.clusters[2], arm.clusters[1])
        return dataclasses.replace(stats, cuped=covariate)

    def split(self, share: str) -> SplitCounts:
        return self.splits.setdefault(share, SplitCounts())

    def heaviest_user(self) -> float:
        """The most requests one user bucket made in the judged splits: an upper bound on
        any one user's (0 for records without buckets)."""
        judged = [s for share, s in self.splits.items() if 0 < float(share) < 1]
        counts = [s.bucket_counts() for s in judged]
        dense = [c for c in counts if c is not None]
        return float(np.max(np.sum(dense, axis=0))) if dense else 0.0

    def split_test_counts(self) -> tuple[int, int, float, float | None]:
        """(control, canary) requests the canary split assigned, the canary share expected of
        them (each split's share times its requests), and the variance of
        ``canary - expected`` when users are assigned at the shares (``assigned_split_variance``;
        for records without buckets, measured between user clusters, None with too few): what
        the sample-ratio test compares. Users, not requests, are assigned to arms, so a few
        heavy users move the request split more than independent requests would."""
        judged = [(float(share), s) for share, s in self.splits.items() if 0 < float(share) < 1]
        control = sum(s.control for _, s in judged)
        canary = sum(s.canary for _, s in judged)
        total = control + canary
        expected = sum(share * (s.control + s.canary) for share, s in judged)
        share_of_total = expected / total if total else self.weight
        counts = [s.bucket_counts() for _, s in judged]
        if judged and all(c is not None for c in counts):
            shares = [share for share, _ in judged]
            assigned = assigned_split_variance(shares, [c for c in counts if c is not None])
            return control, canary, share_of_total, assigned
        # records without buckets: the residuals between user clusters
        residual = np.zeros(USER_CLUSTERS)
        for share, s in judged:
            control_k, canary_k = (np.asarray(c, np.float64) for c in s.clusters)
            residual += canary_k - share * (control_k + canary_k)
        used = int(np.count_nonzero(residual)) if judged else 0
        clustered = float(residual @ residual) if used >= 2 else None
        return control, canary, share_of_total, clustered


def assigned_split_variance(shares: list[float], counts: list[np.ndarray]) -> float:
    """Variance of ``canary - expected`` if each user is on the canary exactly when their
    salted hash falls below the share (``VersionRouter``: raising the share keeps them there),
    given how many requests each user made in each split (``counts``: per split, requests per
    user bucket, both arms).

    A user with n_s requests under share w_s adds ``sum_st n_s n_t (min(w_s, w_t) - w_s w_t)``.
    It depends on who asked how often, not on which arm served them: an estimate from the
    arms' residuals falls exactly when heavy users happen to sit in production and the canary
    is short of its share, which made the split test halt healthy rollouts. Users sharing a
    bucket are separated in expectation: ``sum_b n_bs n_bt`` exceeds ``sum_u n_us n_ut`` by
    ``(N_s N_t - sum_u n_us n_ut) / B`` for users hashed at random into ``B`` buckets."""
    variance = 0.0
    for share_s, n_s in zip(shares, counts, strict=True):
        for share_t, n_t in zip(shares, counts, strict=True):
            pooled = float(n_s @ n_t)
            per_user = (pooled - n_s.sum() * n_t.sum() / SPLIT_BUCKETS) / (1 - 1 / SPLIT_BUCKETS)
            variance += (min(share_s, share_t) - share_s * share_t) * max(per_user, 0.0)
    return variance


class OperatorRequest(BaseModel):
    """``cascade rollback`` / ``promote`` asking the controller of rollout ``rollout`` to
    end it now (it holds the lock, so the command cannot act itself)."""

    action: Action
    rollout: str = Field(description="The id of the rollout it is for (ignored by any other).")
    reason: str = Field("", description="The operator's words, kept in the audit trail.")
    at: float = Field(default_factory=time.time)
    by: str = ""


class RolloutLog(ABC):
    """Where the rollout record, its audit trail and the operator's request live."""

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

    @abstractmethod
    def put_request(self, request: OperatorRequest) -> None:
        """Store the operator's request (replacing an earlier one)."""

    @abstractmethod
    def request(self) -> OperatorRequest | None:
        """The pending operator request, if any."""

    @abstractmethod
    def clear_request(self) -> None: ...

    def close(self) -> None:
        return None


class RedisRolloutLog(RolloutLog):
    def __init__(self, url: str, namespace: str = "cascade", timeout_s: float = 2.0) -> None:
        self.client = sync_client(url, timeout_s)
        self.key, self.stream = f"{namespace}:rollout:state", f"{namespace}:rollout:audit"
        self.request_key = f"{namespace}:rollout:request"

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

    def put_request(self, request: OperatorRequest) -> None:
        self.client.set(self.request_key, request.model_dump_json())

    def request(self) -> OperatorRequest | None:
        raw = self.client.get(self.request_key)
        return None if raw is None else OperatorRequest.model_validate_json(raw)

    def clear_request(self) -> None:
        self.client.delete(self.request_key)

    def close(self) -> None:
        self.client.close()


class FileRolloutLog(RolloutLog):
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path, self.trail = directory / "state.json", directory / "audit.jsonl"
        self.request_path = directory / "request.json"

    def load(self) -> RolloutRecord | None:
        try:
            return RolloutRecord.model_validate_json(self.path.read_text())
        except FileNotFoundError:
            return None

    def _replace(self, path: Path, text: str) -> None:
        """Write ``path`` atomically (a reader sees the old or the new text, whole)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        staging.write_text(text)
        with staging.open() as handle:
            os.fsync(handle.fileno())
        staging.replace(path)

    def save(self, record: RolloutRecord) -> None:
        record.updated_at = time.time()
        self._replace(self.path, record.model_dump_json())

    def put_request(self, request: OperatorRequest) -> None:
        self._replace(self.request_path, request.model_dump_json())

    def request(self) -> OperatorRequest | None:
        try:
            return OperatorRequest.model_validate_json(self.request_path.read_text())
        except FileNotFoundError:
            return None

    def clear_request(self) -> None:
        self.request_path.unlink(missing_ok=True)

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
