"""The hierarchical embedding cache behind DLRM scoring (implements ``EmbeddingLookup``).

All tables of one model version share one key space (table offset + row id) and therefore
one device tier (a torch tensor on the GPU when one exists, else on the CPU), one larger host
tier, and Redis with every row. A batch ``[N, T]`` of ids is looked up as a whole:

1. offset its keys (ids outside their table map to the default row, counted);
2. one gather of the device tier in request order, then one probe of the host tier for the
   positions that missed (no unique and no per-key Python while keys hit);
3. the misses, uniqued, either
   - ``miss_policy="fetch"`` (exact, the default): read in ONE MGET and returned; inserted
     synchronously while the hit ratio is below ``async_threshold``, on the background
     thread above it; or
   - ``miss_policy="defer"`` (bounded latency): the same while the hit ratio is below
     ``async_threshold``; above it they are answered with the default row now (counted as
     ``deferred``) and read and inserted on the background thread, so the request path
     never waits for Redis once the cache is warm;
4. rows come back in request order.

Never-stored ids get the default row (counted); Redis down -> hits still served, default rows
for misses, ``degraded`` set, nothing raised. After ``breaker.failures`` failed reads in a row
a circuit breaker opens: misses get default rows at once, without touching Redis, until a
half-open read (after ``breaker.reset_s``) succeeds, so a stalled Redis costs at most a few
timeouts, never one per request. ``switch_version`` starts a fresh generation of
tiers, and background work of an older generation is dropped, so a version switch never
serves a row of the old version.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from services.embedding_cache.backing import RedisRows
from services.embedding_cache.metrics import DEFAULTS, EVICTIONS, LOOKUP_SECONDS, LOOKUPS
from services.embedding_cache.tier import CacheTier, Policy
from services.inference.embeddings import EmbeddingLookup
from services.settings import BreakerSettings
from services.util.resilience import CircuitBreaker

if TYPE_CHECKING:
    from services.settings import EmbeddingCacheSettings

MissPolicy = Literal["fetch", "defer"]
MAX_QUEUED = 256  # background items beyond this are dropped (deferred keys are asked again)
MERGE_ITEMS = 16  # deferred fetches queued together are read in one MGET


@dataclass(frozen=True)
class CacheConfig:
    """Capacity per tier as rows (> 1) or as a fraction of all tables' rows (<= 1)."""

    device_capacity: float = 0.05
    host_capacity: float = 0.2
    policy: Policy = "lru"
    async_threshold: float = 0.9
    miss_policy: MissPolicy = "fetch"
    breaker: BreakerSettings = field(
        default_factory=lambda: BreakerSettings(failures=3, reset_s=1.0)
    )

    @classmethod
    def from_settings(cls, settings: EmbeddingCacheSettings) -> CacheConfig:
        """The cache's part of the gateway settings, field by field."""
        return cls(**{name: getattr(settings, name) for name in cls.__dataclass_fields__})

    def rows(self, capacity: float, total_rows: int) -> int:
        return max(1, int(capacity * total_rows) if capacity <= 1 else int(capacity))


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class _Generation:
    """The tiers of one model version; replaced whole on a version switch."""

    def __init__(
        self, version: int, total: int, dim: int, config: CacheConfig, device: torch.device
    ) -> None:
        self.version = version
        self.device_tier = CacheTier(
            "device", total, dim, config.rows(config.device_capacity, total), config.policy, device
        )
        self.host_tier = CacheTier(
            "host",
            total,
            dim,
            config.rows(config.host_capacity, total),
            config.policy,
            torch.device("cpu"),
        )
        self.in_flight = np.zeros(total, dtype=bool)  # deferred keys queued for a fetch


class HierarchicalEmbeddingCache(EmbeddingLookup):
    """All tables of one model version behind device -> host -> Redis tiers."""

    def __init__(
        self,
        backing: RedisRows,
        version: int,
        tables: dict[str, int],
        dim: int,
        config: CacheConfig | None = None,
        device: torch.device | None = None,
    ) -> None:
        if not tables:
            raise ValueError("the embedding cache needs at least one table")
        self.backing = backing
        self.names = list(tables)
        self.sizes = np.array(list(tables.values()), dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        self.total = int(self.sizes.sum())
        self.dim = dim
        self.config = config or CacheConfig()
        if self.config.miss_policy not in ("fetch", "defer"):
            raise ValueError(f"miss_policy {self.config.miss_policy!r} is not fetch or defer")
        self.device = device or default_device()
        self.generation = _Generation(version, self.total, dim, self.config, self.device)
        self.lock = threading.Lock()
        self.hit_ratio = 0.0  # running mean over batches of the share of keys found in a tier
        self.store_failed = False  # the last Redis read (of either thread) failed
        self.breaker = CircuitBreaker("embedding_cache_redis", self.config.breaker)
        self.failure_reason = "redis_unavailable"  # of the last failed read: or circuit_open
        # running totals (benchmarks, tests): keys asked for (in range), found in a tier, found
        # per tier; unique keys read from Redis, and answered with a deferred default row
        self.stats = dict.fromkeys(
            ("keys", "key_hits", "device_hits", "host_hits", "fetched", "deferred"), 0
        )
        self._background: queue.Queue = queue.Queue(maxsize=MAX_QUEUED)
        self._worker = threading.Thread(
            target=self._background_loop, daemon=True, name="embedding-cache-background"
        )
        self._worker.start()

    @property
    def version(self) -> int:
        return self.generation.version

    @property
    def device_tier(self) -> CacheTier:
        return self.generation.device_tier

    @property
    def host_tier(self) -> CacheTier:
        return self.generation.host_tier

    def switch_version(self, version: int) -> None:
        """Serve ``version`` from now on, from fresh tiers (no row of the old version survives)."""
        fresh = _Generation(version, self.total, self.dim, self.config, self.device)
        with self.lock:
            self.generation = fresh
            self.hit_ratio = 0.0

    # -- the request path ---------------------------------------------------------------------

    def lookup(self, sparse: np.ndarray) -> np.ndarray:
        started = time.perf_counter()
        sparse = np.asarray(sparse, dtype=np.int64)
        if sparse.ndim != 2 or sparse.shape[1] != len(self.names):
            raise ValueError(f"expected ids of shape [N, {len(self.names)}], got {sparse.shape}")
        valid = ((sparse >= 0) & (sparse < self.sizes)).ravel()
        keys = (sparse + self.offsets).ravel()
        all_valid = bool(valid.all())
        if not all_valid:
            DEFAULTS.labels(reason="out_of_range").inc(int((~valid).sum()))
            keys = np.where(valid, keys, 0)
        generation = self.generation
        out, missing = self._probe(generation, keys, valid)
        hits = int(valid.sum()) - len(missing)
        self.stats["keys"] += hits + len(missing)
        self.stats["key_hits"] += hits
        self.hit_ratio = 0.9 * self.hit_ratio + 0.1 * hits / max(hits + len(missing), 1)
        self.degraded = False
        if len(missing):
            unique, inverse = np.unique(keys[missing], return_inverse=True)
            rows = torch.zeros((len(unique), self.dim), dtype=torch.float32)  # default rows
            if self.config.miss_policy == "defer" and self.hit_ratio >= self.config.async_threshold:
                self._defer(generation, unique)
                self.degraded = self.store_failed
            else:
                self.degraded = self._fetch(generation, unique, rows)
            out[torch.from_numpy(missing)] = rows[torch.from_numpy(inverse.reshape(-1))]
        if not all_valid:
            out[torch.from_numpy(~valid)] = 0.0
        LOOKUP_SECONDS.observe(time.perf_counter() - started)
        return out.numpy().reshape(sparse.shape[0], len(self.names), self.dim)

    def _probe(
        self, generation: _Generation, keys: np.ndarray, valid: np.ndarray
    ) -> tuple[torch.Tensor, np.ndarray]:
        """Rows ``[len(keys), dim]`` as far as the tiers hold them, and the positions that
        missed both tiers (to be filled). Host hits are promoted to the device tier. The hit
        path is one gather per tier, in request order: no unique, no per-key Python."""
        device, host = generation.device_tier, generation.host_tier
        with self.lock:
            slots, hit = device.probe(keys)
            out = device.gather(np.where(hit, slots, 0)).cpu()  # misses get overwritten
            rest = np.flatnonzero(~hit & valid)
            host_hits = 0
            if len(rest):
                host_slots, host_hit = host.probe(keys[rest])
                if host_hit.any():
                    positions = rest[host_hit]
                    rows = host.gather(host_slots[host_hit])
                    out[torch.from_numpy(positions)] = rows
                    promoted, first = np.unique(keys[positions], return_index=True)
                    self._insert(device, promoted, rows[torch.from_numpy(first)])
                    host_hits = len(positions)
                rest = rest[~host_hit]
        device_hits = int((hit & valid).sum())
        self.stats["device_hits"] += device_hits
        self.stats["host_hits"] += host_hits
        LOOKUPS.labels(tier="device", result="hit").inc(device_hits)
        LOOKUPS.labels(tier="host", result="hit").inc(host_hits)
        LOOKUPS.labels(tier="host", result="miss").inc(len(rest))
        return out, rest

    def _fetch(self, generation: _Generation, keys: np.ndarray, rows: torch.Tensor) -> bool:
        """Read the unique missed ``keys`` from Redis into ``rows`` and insert them; True when
        the store failed (the rows stay default rows)."""
        self.stats["fetched"] += len(keys)
        read = self._read_misses(generation, keys)
        if read is None:
            DEFAULTS.labels(reason=self.failure_reason).inc(len(keys))
            return True
        values, present = read
        rows.copy_(torch.from_numpy(values))
        keys, stored = keys[present], rows[torch.from_numpy(present)]
        if len(keys) == 0:
            return False
        if self.hit_ratio >= self.config.async_threshold and self._enqueue(
            ("insert", generation, keys, stored)
        ):
            return False
        self._insert_fetched(generation, keys, stored)
        return False

    def _defer(self, generation: _Generation, keys: np.ndarray) -> None:
        """Answer ``keys`` with the default row now; fetch and insert them in the background."""
        self.stats["deferred"] += len(keys)
        DEFAULTS.labels(reason="deferred").inc(len(keys))
        keys = keys[~generation.in_flight[keys]]
        if len(keys) and self._enqueue(("fetch", generation, keys, None)):
            generation.in_flight[keys] = True

    def _read_misses(
        self, generation: _Generation, keys: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """``_read`` for either thread: counts the fetch and the keys never stored, records
        whether the store answered; None when it failed."""
        if not self.breaker.allow():  # Redis failed just now: do not wait on it again
            self.failure_reason = "circuit_open"
            self.store_failed = True
            return None
        LOOKUPS.labels(tier="redis", result="fetch").inc(len(keys))
        try:
            values, present = self._read(generation.version, keys)
        except Exception:
            self.breaker.record_failure()
            self.failure_reason = "redis_unavailable"
            self.store_failed = True
            return None
        self.breaker.record_success()
        self.store_failed = False
        if not present.all():
            DEFAULTS.labels(reason="not_in_store").inc(int((~present).sum()))
        return values, present

    def _read(self, version: int, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, present)`` of sorted global ``keys``, in one MGET (raises on Redis errors)."""
        bounds = np.searchsorted(keys, self.offsets)  # keys are sorted, so tables are contiguous
        ends = np.append(bounds[1:], len(keys))
        wanted = [
            (name, keys[start:end] - offset)
            for name, start, end, offset in zip(self.names, bounds, ends, self.offsets, strict=True)
            if end > start
        ]
        parts = self.backing.fetch_many(version, wanted, self.dim)
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    # -- inserts and the background thread ----------------------------------------------------

    def _insert(self, tier: CacheTier, keys: np.ndarray, rows: torch.Tensor) -> None:
        absent = tier.slot_of[keys] < 0
        if not absent.any():
            return
        before = tier.evictions
        tier.insert(keys[absent], rows[torch.from_numpy(absent)])
        EVICTIONS.labels(tier=tier.name).inc(tier.evictions - before)

    def _insert_fetched(
        self, generation: _Generation, keys: np.ndarray, rows: torch.Tensor
    ) -> None:
        with self.lock:
            if generation is not self.generation:
                return  # fetched for a version no longer served
            self._insert(generation.host_tier, keys, rows)
            self._insert(generation.device_tier, keys, rows)

    def _enqueue(self, item: tuple) -> bool:
        try:
            self._background.put_nowait(item)
            return True
        except queue.Full:
            return False

    def _background_loop(self) -> None:
        """Apply queued work in order; deferred fetches waiting together share one MGET."""
        while True:
            items = [self._background.get()]
            while len(items) < MERGE_ITEMS:
                try:
                    items.append(self._background.get_nowait())
                except queue.Empty:
                    break
            fetches: dict[_Generation, list[np.ndarray]] = {}
            for item in items:
                if item is not None and item[0] == "fetch":
                    fetches.setdefault(item[1], []).append(item[2])
                    continue
                self._fetch_merged(fetches)  # what came before runs first
                fetches = {}
                if item is None:
                    return
                kind, generation, keys, rows = item
                if kind == "marker":
                    generation.set()
                else:
                    self._insert_fetched(generation, keys, rows)
            self._fetch_merged(fetches)

    def _fetch_merged(self, fetches: dict[_Generation, list[np.ndarray]]) -> None:
        for generation, parts in fetches.items():
            self._fetch_deferred(generation, np.unique(np.concatenate(parts)))

    def _fetch_deferred(self, generation: _Generation, keys: np.ndarray) -> None:
        read = self._read_misses(generation, keys)
        if read is not None:
            values, present = read
            self._insert_fetched(generation, keys[present], torch.from_numpy(values[present]))
        generation.in_flight[keys] = False  # asked for again if they missed or failed

    def flush(self) -> None:
        """Wait until queued background work is applied (tests, benchmarks)."""
        done = threading.Event()
        self._background.put(("marker", done, None, None))
        done.wait(timeout=30)

    def close(self) -> None:
        """Stop the background thread (queued work is dropped) and close the connections."""
        while True:
            try:
                self._background.get_nowait()
            except queue.Empty:
                break
        self._background.put(None)
        self._worker.join(timeout=5)
        self.backing.close()
