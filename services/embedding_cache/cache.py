"""The hierarchical embedding cache behind DLRM scoring (implements ``EmbeddingLookup``).

Per table and model version: a device tier (a torch tensor on the GPU when one exists, else
on the CPU) with the hottest rows, a larger host tier, and Redis with every row. A batch:

1. unique its keys (ids outside the table map to the default row, counted);
2. one vectorised probe of the device tier, then of the host tier for what missed;
3. one MGET to Redis for what every table missed (never-seen ids -> default row, counted;
   Redis down -> default rows, ``degraded`` set, nothing raised);
4. insert fetched rows — synchronously while the hit ratio is below ``async_threshold``,
   on a background thread above it — and return the rows in request order.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from services.embedding_cache.backing import RedisRows
from services.embedding_cache.metrics import DEFAULTS, EVICTIONS, LOOKUP_SECONDS, LOOKUPS
from services.embedding_cache.tier import CacheTier, Policy
from services.inference.embeddings import EmbeddingLookup


@dataclass(frozen=True)
class CacheConfig:
    """Capacity per tier as rows (> 1) or as a fraction of the table (<= 1)."""

    device_capacity: float = 0.05
    host_capacity: float = 0.2
    policy: Policy = "lru"
    async_threshold: float = 0.9

    def rows(self, capacity: float, table_rows: int) -> int:
        return max(1, int(capacity * table_rows) if capacity <= 1 else int(capacity))


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class TableCache:
    """The tiers of one table for one model version."""

    def __init__(
        self,
        table: str,
        rows: int,
        dim: int,
        version: int,
        backing: RedisRows,
        config: CacheConfig,
        device: torch.device,
    ) -> None:
        self.table, self.rows, self.dim, self.version = table, rows, dim, version
        self.backing = backing
        self.config = config
        self.device_tier = CacheTier(
            "device", rows, dim, config.rows(config.device_capacity, rows), config.policy, device
        )
        self.host_tier = CacheTier(
            "host",
            rows,
            dim,
            config.rows(config.host_capacity, rows),
            config.policy,
            torch.device("cpu"),
        )
        self.lock = threading.Lock()
        self.hit_ratio = 0.0
        self.degraded = False
        # running totals: keys asked for, unique keys, and hits of each (for benchmarks, tests)
        self.stats = {"keys": 0, "key_hits": 0, "unique": 0, "device_hits": 0, "host_hits": 0}

    def _insert(self, tier: CacheTier, keys: np.ndarray, rows: torch.Tensor) -> None:
        before = tier.evictions
        tier.insert(keys, rows)
        EVICTIONS.labels(tier=tier.name).inc(tier.evictions - before)

    def insert_fetched(self, keys: np.ndarray, rows: torch.Tensor) -> None:
        with self.lock:
            absent = self.host_tier.slot_of[keys] < 0
            if absent.any():
                self._insert(self.host_tier, keys[absent], rows[torch.from_numpy(absent)])
            absent = self.device_tier.slot_of[keys] < 0
            if absent.any():
                self._insert(self.device_tier, keys[absent], rows[torch.from_numpy(absent)])

    def probe(self, keys: np.ndarray) -> _Pending:
        """Serve what the tiers hold; return the rest to be fetched (all tables at once)."""
        keys = np.asarray(keys, dtype=np.int64)
        valid = (keys >= 0) & (keys < self.rows)
        if not valid.all():
            DEFAULTS.labels(reason="out_of_range").inc(int((~valid).sum()))
        unique, inverse = np.unique(np.where(valid, keys, 0), return_inverse=True)
        found = torch.zeros((len(unique), self.dim), dtype=torch.float32)
        with self.lock:
            slots, hit = self.device_tier.probe(unique)
            if hit.any():
                found[torch.from_numpy(hit)] = self.device_tier.gather(slots[hit]).cpu()
            rest = np.flatnonzero(~hit)
            host_slots, host_hit = self.host_tier.probe(unique[rest])
            if host_hit.any():
                found[torch.from_numpy(rest[host_hit])] = self.host_tier.gather(
                    host_slots[host_hit]
                )
                promoted = rest[host_hit]
                absent = self.device_tier.slot_of[unique[promoted]] < 0
                self._insert(
                    self.device_tier,
                    unique[promoted][absent],
                    found[torch.from_numpy(promoted[absent])],
                )
        missing = rest[~host_hit]
        LOOKUPS.labels(tier="device", result="hit").inc(int(hit.sum()))
        LOOKUPS.labels(tier="host", result="hit").inc(int(host_hit.sum()))
        LOOKUPS.labels(tier="redis", result="fetch").inc(len(missing))
        cached = np.ones(len(unique), dtype=bool)
        cached[missing] = False
        self.stats["keys"] += len(keys)
        self.stats["key_hits"] += int(cached[inverse.reshape(-1)].sum())
        self.stats["unique"] += len(unique)
        self.stats["device_hits"] += int(hit.sum())
        self.stats["host_hits"] += int(host_hit.sum())
        batch_hit_ratio = 1.0 - len(missing) / max(len(unique), 1)
        self.hit_ratio = 0.9 * self.hit_ratio + 0.1 * batch_hit_ratio
        return _Pending(valid, unique, inverse.reshape(-1), found, missing)

    def complete(
        self,
        pending: _Pending,
        fetched: tuple[np.ndarray, np.ndarray] | None,
        inserter: queue.SimpleQueue | None,
    ) -> torch.Tensor:
        """Fill the fetched rows (``None``: the store failed -> default rows, degraded), insert
        them, and return rows ``[len(keys), dim]`` in request order."""
        missing, unique, found = pending.missing, pending.unique, pending.found
        self.degraded = False
        if len(missing) and fetched is None:
            self.degraded = True
            DEFAULTS.labels(reason="redis_unavailable").inc(len(missing))
        elif len(missing) and fetched is not None:
            values, present = fetched
            if not present.all():
                DEFAULTS.labels(reason="not_in_store").inc(int((~present).sum()))
            rows = torch.from_numpy(values)
            found[torch.from_numpy(missing)] = rows
            keys_found, rows_found = unique[missing][present], rows[torch.from_numpy(present)]
            if len(keys_found):
                if inserter is not None and self.hit_ratio >= self.config.async_threshold:
                    inserter.put((self, keys_found, rows_found))
                else:
                    self.insert_fetched(keys_found, rows_found)
        out = found[torch.from_numpy(pending.inverse)]
        if not pending.valid.all():
            out[torch.from_numpy(~pending.valid)] = 0.0
        return out


@dataclass
class _Pending:
    """One table's part of a batch between the tier probe and the Redis fetch."""

    valid: np.ndarray
    unique: np.ndarray
    inverse: np.ndarray
    found: torch.Tensor
    missing: np.ndarray


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
        self.backing = backing
        self.tables = tables
        self.dim = dim
        self.config = config or CacheConfig()
        self.device = device or default_device()
        self.version = version
        self.caches = self._build(version)
        self._inserts: queue.SimpleQueue = queue.SimpleQueue()
        self._worker = threading.Thread(
            target=self._insert_loop, daemon=True, name="embedding-cache-insert"
        )
        self._worker.start()

    def _build(self, version: int) -> list[TableCache]:
        return [
            TableCache(name, rows, self.dim, version, self.backing, self.config, self.device)
            for name, rows in self.tables.items()
        ]

    def _insert_loop(self) -> None:
        while True:
            item = self._inserts.get()
            if item is None:
                return
            cache, keys, rows = item
            cache.insert_fetched(keys, rows)

    def switch_version(self, version: int) -> None:
        """Serve ``version`` from now on, from fresh tiers (no row of the old version survives)."""
        self.caches = self._build(version)
        self.version = version

    def lookup(self, sparse: np.ndarray) -> np.ndarray:
        started = time.perf_counter()
        sparse = np.asarray(sparse, dtype=np.int64)
        if sparse.ndim != 2 or sparse.shape[1] != len(self.caches):
            raise ValueError(f"expected ids of shape [N, {len(self.caches)}], got {sparse.shape}")
        out = np.empty((sparse.shape[0], len(self.caches), self.dim), dtype=np.float32)
        pending = [cache.probe(sparse[:, j]) for j, cache in enumerate(self.caches)]
        wanted = [(c.table, p.unique[p.missing]) for c, p in zip(self.caches, pending, strict=True)]
        fetched: list[tuple[np.ndarray, np.ndarray]] | list[None]
        try:  # one MGET for the misses of every table
            fetched = self.backing.fetch_many(self.version, wanted, self.dim)
        except Exception:
            fetched = [None] * len(self.caches)
        for j, (cache, part) in enumerate(zip(self.caches, pending, strict=True)):
            out[:, j] = cache.complete(part, fetched[j], self._inserts).numpy()
        self.degraded = any(c.degraded for c in self.caches)
        LOOKUP_SECONDS.observe(time.perf_counter() - started)
        return out

    def flush(self) -> None:
        """Wait until queued background inserts are applied (tests, benchmarks)."""
        done = threading.Event()
        self._inserts.put((_Marker(done), np.zeros(0, np.int64), torch.zeros(0)))
        done.wait(timeout=30)

    def close(self) -> None:
        self._inserts.put(None)
        self._worker.join(timeout=5)


class _Marker:
    """A queue item whose 'insert' signals that everything before it was applied."""

    def __init__(self, done: threading.Event) -> None:
        self.done = done

    def insert_fetched(self, keys: np.ndarray, rows: torch.Tensor) -> None:
        self.done.set()
