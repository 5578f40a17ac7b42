"""The embedding rows on a Redis Cluster: a key layout whose batches spread over the nodes,
and a reader that sends each node its MGETs in one write.

A Cluster answers a multi-key command only when every key hashes to one slot. A row's key
carries a hash tag of its version, table and bucket (``row % BUCKETS``), so rows of one bucket
share a slot (one MGET reads them) while a table spreads over ``BUCKETS`` slots, that is over
every node of the Cluster (docs/redis.md). A batch of misses is grouped by slot, the groups
by node; every node gets its MGETs in one write before any reply is read, so the nodes work
at the same time and a batch costs about one round trip.
"""

from __future__ import annotations

import binascii
import functools
from typing import Any

import hiredis
import numpy as np

from services.embedding_cache.resp import RespConnection

SLOTS = 16_384
BUCKETS = (
    64  # slots per table and version; part of the key layout (docs/benchmarks/redis_cluster.md)
)


def key_slot(key: bytes) -> int:
    """The Cluster slot of ``key`` (CRC16 of its hash tag, else of the whole key)."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return binascii.crc_hqx(key, 0) % SLOTS


def bucket_tag(version: int, table: str, bucket: int) -> bytes:
    """The hash tag of one bucket of a table's rows."""
    return b"{v%d:%s:%d}" % (version, table.encode(), bucket)


@functools.lru_cache(maxsize=4096)
def table_slots(version: int, table: str, buckets: int = BUCKETS) -> np.ndarray:
    """The slot of each bucket of ``table`` at ``version`` (read-only)."""
    tags = (bucket_tag(version, table, b) for b in range(buckets))
    slots = np.fromiter(map(key_slot, tags), np.int32, buckets)
    slots.flags.writeable = False
    return slots


@functools.lru_cache(maxsize=4096)
def _heads(prefix: bytes, version: int, table: str, buckets: int) -> tuple[bytes, ...]:
    return tuple(prefix + bucket_tag(version, table, b) + b":" for b in range(buckets))


def row_names(
    prefix: bytes, version: int, table: str, rows: np.ndarray, buckets: int = BUCKETS
) -> list[bytes]:
    """The keys of ``rows``: ``prefix``, the row's bucket tag, ``:``, the row."""
    heads = _heads(prefix, version, table, buckets)
    of_row = (rows % buckets).tolist()
    return [heads[b] + b"%d" % row for b, row in zip(of_row, rows.tolist(), strict=True)]


class ClusterReader:
    """MGETs grouped by slot and node over one ``RespConnection`` per node (one reader per
    thread, like the connection it replaces). The slot map is read from the seed node at
    the first call and again after a ``MOVED`` (a resharded slot); any other error raises."""

    def __init__(self, seed: RespConnection) -> None:
        self.seed = seed
        self.node_of_slot = np.full(SLOTS, -1, np.int32)
        self.nodes: list[RespConnection] = []

    def refresh(self) -> None:
        """Read which node serves which slot (``CLUSTER SLOTS``)."""
        reply = self._any_node().execute("CLUSTER", "SLOTS")
        by_address = {(c.host, c.port): c for c in self.nodes}
        nodes: list[RespConnection] = []
        index: dict[tuple[str, int], int] = {}
        self.node_of_slot[:] = -1
        for start, end, primary, *_replicas in reply:
            host = primary[0].decode() or self.seed.host  # "" = the node asked
            address = (host, int(primary[1]))
            if address not in index:
                index[address] = len(nodes)
                known = by_address.pop(address, None)
                nodes.append(known or self.seed.at(*address))
            self.node_of_slot[start : end + 1] = index[address]
        for gone in by_address.values():
            gone.close()
        self.nodes = nodes

    def _any_node(self) -> RespConnection:
        for node in self.nodes:  # a known node first: the seed may be the one that is gone
            try:
                node.execute("PING")
                return node
            except (ConnectionError, hiredis.ReplyError):
                continue
        return self.seed

    def mget(self, names: list[bytes], slots: np.ndarray) -> list[Any]:
        """The values of ``names`` (``slots[i]`` is the slot of ``names[i]``), in order."""
        if not self.nodes:
            self.refresh()
        try:
            return self._mget(names, slots)
        except _Moved:
            self.refresh()
            return self._mget(names, slots)

    def _mget(self, names: list[bytes], slots: np.ndarray) -> list[Any]:
        order = np.argsort(slots, kind="stable")
        sorted_slots = slots[order]
        starts = np.flatnonzero(np.diff(sorted_slots, prepend=-1))
        ends = np.append(starts[1:], len(order))
        nodes = self.node_of_slot[sorted_slots[starts]]
        if (nodes < 0).any():
            raise ConnectionError("a slot of the batch is served by no node of the Cluster")
        # per node: the (start, end) runs of ``order`` it answers, one MGET each
        runs: dict[int, list[tuple[int, int]]] = {}
        for node, start, end in zip(nodes.tolist(), starts.tolist(), ends.tolist(), strict=True):
            runs.setdefault(node, []).append((start, end))
        positions = order.tolist()
        try:
            for node, node_runs in runs.items():
                self.nodes[node].send(
                    [("MGET", *(names[i] for i in positions[a:b])) for a, b in node_runs]
                )
            replies = {node: self.nodes[node].receive(len(r)) for node, r in runs.items()}
        except BaseException:
            for node in runs:  # a node sent to but not read would answer the next call with
                self.nodes[node].close()  # this one's replies: drop its connection
            raise
        values: list[Any] = [None] * len(names)
        moved = False
        for node, node_runs in runs.items():
            for (a, b), reply in zip(node_runs, replies[node], strict=True):
                if isinstance(reply, hiredis.ReplyError):
                    if str(reply).startswith("MOVED"):
                        moved = True
                        continue
                    raise reply
                for i, value in zip(positions[a:b], reply, strict=True):
                    values[i] = value
        if moved:
            raise _Moved
        return values

    def close(self) -> None:
        for node in self.nodes:
            node.close()
        self.nodes = []
        self.seed.close()


class _Moved(Exception):
    """A slot moved to another node since the slot map was read."""
