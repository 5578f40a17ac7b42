"""String ids -> internal ids at scale: 128-bit fingerprints of the strings, computed on the
arrow buffers in numpy, kept in a persistent open-addressing table, so each batch's distinct
ids are looked up without Python objects (docs/benchmarks/ingest.md has the alternatives
measured)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_M1, _M2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F)
_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(h: np.ndarray) -> np.ndarray:
    h ^= h >> np.uint64(31)
    h *= _M2
    h ^= h >> np.uint64(29)
    return h


def fingerprints(words: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Two independent 64-bit hashes of each string of ``words`` (no nulls), computed on the
    arrow buffers 8 bytes at a time: 128 bits that tell distinct ids apart."""
    wide = pa.types.is_large_string(words.type)
    offsets = np.frombuffer(words.buffers()[1], np.int64 if wide else np.int32)
    offsets = offsets[words.offset : words.offset + len(words) + 1].astype(np.int64)
    data = words.buffers()[2]
    raw = np.zeros((data.size if data is not None else 0) + 8, np.uint8)
    if data is not None:
        raw[: data.size] = np.frombuffer(data, np.uint8)
    window = np.ndarray((len(raw) - 7,), dtype="<u8", buffer=raw, strides=(1,))  # unaligned
    start, length = offsets[:-1], np.diff(offsets)
    with np.errstate(over="ignore"):
        h1 = _mix(length.astype(np.uint64) * _M1)
        h2 = _mix(~h1 ^ _M2)
        shortest = int(length.min(initial=0))
        for k in range(0, int(length.max(initial=0)), 8):
            if k + 8 <= shortest:  # every word has 8 bytes here: no masking
                chunk = window[start + k]
                h1 = _mix(h1 ^ chunk) * _M1
                h2 = _mix((h2 + chunk) * _M2) ^ (h2 >> np.uint64(17))
                continue
            live = np.flatnonzero(length > k)  # words with bytes left at offset k
            chunk = window[start[live] + k]
            left = np.minimum(length[live] - k, 8).astype(np.uint64)
            chunk &= np.where(left >= 8, _ALL, (np.uint64(1) << (left * np.uint64(8))) - 1)
            h1[live] = _mix(h1[live] ^ chunk) * _M1
            h2[live] = _mix((h2[live] + chunk) * _M2) ^ (h2[live] >> np.uint64(17))
        h1 = _mix(h1)
    h1[h1 == 0] = 1  # 0 marks an empty slot
    return h1, h2


class StringIds:
    """String ids -> internal ids 1..N in first-seen order: the strings' fingerprints in an
    open-addressing hash table of numpy arrays, so a batch's distinct ids are looked up and
    added vectorised, without rebuilding anything per batch. A slot is one row of
    ``(fingerprint 1, fingerprint 2, id)``, so a probe touches one cache line."""

    def __init__(self) -> None:
        self._slots = np.zeros((1 << 12, 3), np.uint64)  # fingerprint 1 = 0: empty
        self.count = 0
        self._words: list[pa.Array] = []

    def ids(self, words: pa.Array) -> np.ndarray:
        """The internal ids of ``words`` (distinct, as a dictionary's are); those not met
        before are numbered on, in their order."""
        h1, h2 = fingerprints(words)
        out = self._find(h1, h2)
        new = np.flatnonzero(out == 0)
        if new.size:
            out[new] = self.count + 1 + np.arange(new.size)
            self._grow(new.size)
            self._place(h1[new], h2[new], out[new].astype(np.uint64))
            self.count += new.size
            self._words.append(words.take(pa.array(new)))
        return out

    def words(self) -> list[str]:
        """Every id, in internal id order."""
        return [w for chunk in self._words for w in chunk.to_pylist()]

    def _find(self, h1: np.ndarray, h2: np.ndarray) -> np.ndarray:
        mask = np.uint64(len(self._slots) - 1)
        slot, out = h1 & mask, np.zeros(len(h1), np.int64)
        pending = np.arange(len(h1))
        while pending.size:
            rows = np.take(self._slots, slot[pending], axis=0)
            hit = (rows[:, 0] == h1[pending]) & (rows[:, 1] == h2[pending])
            out[pending[hit]] = rows[hit, 2]
            pending = pending[~hit & (rows[:, 0] != 0)]  # linear probing
            slot[pending] = (slot[pending] + np.uint64(1)) & mask
        return out

    def _place(self, h1: np.ndarray, h2: np.ndarray, values: np.ndarray) -> None:
        mask = np.uint64(len(self._slots) - 1)
        slot, pending = h1 & mask, np.arange(len(h1))
        while pending.size:
            at = slot[pending]
            free = self._slots[at, 0] == 0
            claim, where = pending[free], at[free]
            # several may claim one free slot: the last write wins, the others probe on
            self._slots[where] = np.stack([h1[claim], h2[claim], values[claim]], axis=1)
            won = np.zeros(len(pending), bool)
            won[free] = self._slots[where, 2] == values[claim]
            pending = pending[~won]
            slot[pending] = (slot[pending] + np.uint64(1)) & mask

    def _grow(self, more: int) -> None:
        """Keep the table at most half full."""
        size = len(self._slots)
        while (self.count + more) * 2 > size:
            size *= 2
        if size != len(self._slots):
            old = self._slots[self._slots[:, 0] != 0]
            self._slots = np.zeros((size, 3), np.uint64)
            self._place(old[:, 0], old[:, 1], old[:, 2])
