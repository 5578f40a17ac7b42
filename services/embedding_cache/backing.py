"""Redis as the backing tier: every row of every table, binary float32, versioned.

Key: ``{namespace}:emb:v{model_version}:{table}:{row}`` -> ``dim * 4`` bytes (on a Redis
Cluster, a hash tag before the row: ``...:{table}:{v3:t:17}:{row}``, ``cluster.py``). A new
model version writes its own keys, so a version switch can never read the old version's rows.
Reads are one ``MGET`` per batch of misses (over ``RespConnection``, one per thread, for
``redis://`` URLs; on a Cluster one per slot, sent to each node at once); writes are
pipelined ``MSET`` chunks (per bucket on a Cluster). ``{namespace}:emb:v{version}:tables``
(table -> rows, and the dim) is written after every row of a version, so a reader can tell a
completely materialized version from a missing or half-written one.
"""

from __future__ import annotations

import json
import threading
from itertools import pairwise
from typing import Any

import numpy as np
import redis

from services.embedding_cache.cluster import BUCKETS, ClusterReader, row_names, table_slots
from services.embedding_cache.resp import RespConnection
from services.util.redis_client import is_cluster, sync_client

WRITE_CHUNK = 20_000
CLIENT_NAME = "cascade-embedding-cache"  # of the read connections, in CLIENT LIST


class RedisRows:
    """Sync Redis client for the cache (the ranker runs in worker threads / the Triton stub):
    one Redis, or a Redis Cluster for a ``redis+cluster://`` URL."""

    def __init__(self, url: str, namespace: str = "cascade", timeout_s: float = 0.05) -> None:
        self.url = url
        self.cluster = is_cluster(url)
        self.buckets = BUCKETS  # on a Cluster: slots per table and version (the key layout)
        self.namespace = namespace
        self.timeout_s = timeout_s
        self._client: redis.Redis | None = None
        self._local = threading.local()  # one RespConnection (ClusterReader) per reading thread
        self._connections: list[RespConnection | ClusterReader] = []

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            self._client = sync_client(self.url, self.timeout_s)
        return self._client

    def prefix(self, version: int, table: str) -> str:
        return f"{self.namespace}:emb:v{version}:{table}:"

    def write_table(self, version: int, table: str, weights: np.ndarray) -> int:
        """Store every row of ``weights`` under this version; return the rows written."""
        weights = np.ascontiguousarray(weights, dtype="<f4")
        prefix = self.prefix(version, table)
        pipe = self.client.pipeline(transaction=False)
        for start in range(0, len(weights), WRITE_CHUNK):
            chunk = weights[start : start + WRITE_CHUNK]
            if self.cluster:  # one MSET per bucket: its keys share a slot
                rows = np.arange(start, start + len(chunk))
                names = row_names(prefix.encode(), version, table, rows, self.buckets)
                for first in range(min(self.buckets, len(chunk))):  # rows first, first +
                    at = range(first, len(chunk), self.buckets)  # buckets, ... share a bucket
                    pairs = [part for i in at for part in (names[i], chunk[i].tobytes())]
                    pipe.execute_command("MSET", *pairs)  # redis-py refuses pipe.mset here
            else:
                pipe.mset({f"{prefix}{start + i}": row.tobytes() for i, row in enumerate(chunk)})
            if len(pipe) >= 8:
                pipe.execute()
        pipe.execute()
        return len(weights)

    def fetch(
        self, version: int, table: str, keys: np.ndarray, dim: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``[len(keys), dim]`` and a found mask, in one MGET (raises on Redis errors)."""
        return self.fetch_many(version, [(table, keys)], dim)[0]

    def fetch_many(
        self, version: int, wanted: list[tuple[str, np.ndarray]], dim: int
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(rows, found)`` per ``(table, keys)``, all in ONE MGET (raises on Redis errors)."""
        if self.cluster:
            names, slots = self._cluster_names(version, wanted)
            values: list[Any] = self._cluster_mget(names, slots) if names else []
        else:
            names = [
                prefix + b"%d" % key
                for prefix, keys in ((self.prefix(version, t).encode(), k) for t, k in wanted)
                for key in keys.tolist()
            ]
            values = self._mget(names) if names else []
        width = dim * 4
        if None not in values and set(map(len, values)) <= {width}:  # every row stored, whole
            rows = np.frombuffer(b"".join(values), dtype="<f4").reshape(-1, dim).copy()
            return self._split(wanted, rows, np.ones(len(values), dtype=bool))
        found = np.fromiter((v is not None and len(v) == width for v in values), bool, len(values))
        rows = np.zeros((len(values), dim), np.float32)
        if found.any():
            blob = b"".join(v for v, ok in zip(values, found, strict=True) if ok)
            rows[found] = np.frombuffer(blob, dtype="<f4").reshape(-1, dim)
        return self._split(wanted, rows, found)

    def _cluster_names(
        self, version: int, wanted: list[tuple[str, np.ndarray]]
    ) -> tuple[list[bytes], np.ndarray]:
        """The keys of ``wanted`` on a Cluster, and the slot of each."""
        names: list[bytes] = []
        slots = []
        for table, keys in wanted:
            prefix = self.prefix(version, table).encode()
            names += row_names(prefix, version, table, keys, self.buckets)
            slots.append(table_slots(version, table, self.buckets)[keys % self.buckets])
        return names, np.concatenate(slots) if slots else np.zeros(0, np.int32)

    def _mget(self, names: list[bytes]) -> list[Any]:
        if not RespConnection.supports(self.url):
            return self.client.mget(names)
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._local.connection = RespConnection(
                self.url, self.timeout_s, CLIENT_NAME
            )
            self._connections.append(connection)
        return connection.execute("MGET", *names)

    def _cluster_mget(self, names: list[bytes], slots: np.ndarray) -> list[Any]:
        if not RespConnection.supports(self.url):  # TLS: redis-py splits by slot itself
            return self.client.mget_nonatomic(names)  # type: ignore[attr-defined]
        reader = getattr(self._local, "reader", None)
        if reader is None:
            reader = self._local.reader = ClusterReader(
                RespConnection(self.url, self.timeout_s, CLIENT_NAME)
            )
            self._connections.append(reader)
        return reader.mget(names, slots)

    def mark_complete(self, version: int, tables: dict[str, int], dim: int) -> None:
        """Record that every row of ``tables`` of ``version`` is stored (write it last)."""
        spec = json.dumps({"tables": tables, "dim": dim})
        self.client.set(f"{self.namespace}:emb:v{version}:tables", spec)

    def stored_tables(self, version: int) -> dict[str, Any] | None:
        """``{"tables": {name: rows}, "dim": d}`` of a completely stored version, else None."""
        raw = self.client.get(f"{self.namespace}:emb:v{version}:tables")
        return None if raw is None else json.loads(raw)

    @staticmethod
    def _split(
        wanted: list[tuple[str, np.ndarray]], rows: np.ndarray, found: np.ndarray
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        bounds = np.cumsum([0] + [len(keys) for _, keys in wanted])
        return [(rows[a:b], found[a:b]) for a, b in pairwise(bounds)]

    def close(self) -> None:
        for connection in self._connections:
            connection.close()
        self._connections.clear()
        self._local = threading.local()
        if self._client is not None:
            self._client.close()
            self._client = None
