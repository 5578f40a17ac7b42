"""One cache tier: a fixed-capacity tensor of rows with a vectorised key index and eviction.

The index is direct-mapped (``slot_of[key]``, 4 bytes per table row): a batch is probed with
one gather, no hashing and no per-key Python. Eviction is LRU (last access tick) or LFU
(access count); when space runs out a chunk of the coldest slots is freed at once, so the
O(capacity) selection is amortised over many inserts.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch

Policy = Literal["lru", "lfu"]
EVICT_FRACTION = 0.02  # free 2% of capacity (at least the batch) when full


class CacheTier:
    """Rows of one embedding table held on ``device``."""

    def __init__(
        self, name: str, rows: int, dim: int, capacity: int, policy: Policy, device: torch.device
    ) -> None:
        if capacity < 1:
            raise ValueError(f"tier {name}: capacity must be >= 1 row")
        if policy not in ("lru", "lfu"):
            raise ValueError(f"tier {name}: eviction policy {policy!r} is not lru or lfu")
        self.name = name
        self.capacity = min(capacity, rows)
        self.policy = policy
        self.device = device
        self.storage = torch.zeros((self.capacity, dim), dtype=torch.float32, device=device)
        self.slot_of = np.full(rows, -1, dtype=np.int32)  # key -> slot
        self.key_of = np.full(self.capacity, -1, dtype=np.int64)  # slot -> key
        self.score = np.zeros(self.capacity, dtype=np.int64)  # tick (lru) or count (lfu)
        self.free = np.arange(self.capacity - 1, -1, -1, dtype=np.int64)  # a stack of free slots
        self.free_top = self.capacity
        self.tick = 0
        self.evictions = 0

    def probe(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Slots of ``keys`` (unique, in range) and the hit mask; updates recency/frequency."""
        slots = self.slot_of[keys]
        hit = slots >= 0
        self.tick += 1
        if self.policy == "lru":
            self.score[slots[hit]] = self.tick
        else:
            self.score[slots[hit]] += 1
        return slots, hit

    def gather(self, slots: np.ndarray) -> torch.Tensor:
        return self.storage.index_select(
            0, torch.from_numpy(slots.astype(np.int64)).to(self.device)
        )

    def _evict(self, needed: int) -> None:
        count = min(self.capacity, max(needed, int(self.capacity * EVICT_FRACTION)))
        occupied = np.flatnonzero(self.key_of >= 0)
        coldest = occupied[np.argpartition(self.score[occupied], count - 1)[:count]]
        self.slot_of[self.key_of[coldest]] = -1
        self.key_of[coldest] = -1
        self.score[coldest] = 0
        self.free[self.free_top : self.free_top + len(coldest)] = coldest
        self.free_top += len(coldest)
        self.evictions += len(coldest)

    def insert(self, keys: np.ndarray, rows: torch.Tensor) -> None:
        """Insert unique keys not present in this tier (at most ``capacity`` of them)."""
        if len(keys) > self.capacity:
            keys, rows = keys[: self.capacity], rows[: self.capacity]
        if len(keys) > self.free_top:
            self._evict(len(keys) - self.free_top)
        slots = self.free[self.free_top - len(keys) : self.free_top][::-1].copy()
        self.free_top -= len(keys)
        self.storage[torch.from_numpy(slots).to(self.device)] = rows.to(self.device)
        self.slot_of[keys] = slots
        self.key_of[slots] = keys
        self.score[slots] = self.tick if self.policy == "lru" else 1

    @property
    def size(self) -> int:
        return self.capacity - self.free_top
