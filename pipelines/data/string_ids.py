"""String ids -> internal ids at scale, row by row: 128-bit fingerprints of the strings,
computed on the arrow buffers in numpy, the first 64 bits numbered by pandas' compiled hash
table (which keeps its table between batches) and the other 64 checked per row, so no Python
object is made per row and no dictionary is built first (docs/benchmarks/ingest.md has the
alternatives measured)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

# pandas' khash tables (private module, stable since pandas 1.x; the tests pin its behaviour)
from pandas._libs.hashtable import UInt64Factorizer

_M1, _M2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F)
_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
_R1, _R3 = np.uint64(29), np.uint64(32)

Check = Callable[[pa.Array], np.ndarray]
"""Given new distinct words, a code per word: 0 numbers it, any other value rejects it (id 0)."""


def _step(h1: np.ndarray, h2: np.ndarray, word: np.ndarray, scratch: np.ndarray) -> None:
    """Fold one 8-byte word into both hashes, in place: ``h1`` xorshift-xor-multiply, ``h2``
    a polynomial of the words (cheap; it only has to tell apart the rare strings that share
    ``h1``)."""
    h1 ^= np.right_shift(h1, _R1, out=scratch)
    h1 ^= word
    h1 *= _M1
    h2 *= _M2
    h2 += word


def _first(width: int, word: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``_step`` from the starting values of strings of ``width`` bytes (scalars here), in
    two passes instead of five."""
    with np.errstate(over="ignore"):
        start1 = np.uint64(width) * _M1
        start1 ^= start1 >> _R1
        start2 = np.uint64(width) * _M2 * _M2
    h1 = np.bitwise_xor(word, start1)
    h1 *= _M1
    return h1, word + start2


def _finish(h1: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """Spread every bit of ``h1`` over the low bits the hash table indexes with."""
    h1 ^= np.right_shift(h1, _R3, out=scratch)
    h1 *= _M2
    h1 ^= np.right_shift(h1, _R1, out=scratch)
    return h1


def _fixed(data: np.ndarray, n: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Fingerprints of ``n`` strings of ``width`` bytes each, stored back to back in ``data``."""
    words = -(-width // 8)
    if width == 0:
        return _variable(data, np.zeros(n, np.int64), np.zeros(n, np.int64))
    if width == 8 * words:
        matrix = data.view("<u8").reshape(n, words)
    else:  # zero-padded to whole words, as the variable-width path pads them
        padded = np.zeros((n, 8 * words), np.uint8)
        padded[:, :width] = data.reshape(n, width)
        matrix = padded.view("<u8")
    h1, h2 = _first(width, matrix[:, 0])
    scratch = np.empty(n, np.uint64)
    for k in range(1, words):
        _step(h1, h2, matrix[:, k], scratch)
    return _finish(h1, scratch), h2


def _variable(data: np.ndarray, start: np.ndarray, length: np.ndarray) -> tuple:
    """Fingerprints of strings of varying lengths: 8 bytes at a time, the last word of each
    string masked to its own bytes (zero padding, as in ``_fixed``)."""
    raw = np.zeros(len(data) + 8, np.uint8)
    raw[: len(data)] = data
    window = np.ndarray((len(raw) - 7,), dtype="<u8", buffer=raw, strides=(1,))  # unaligned
    size = length.astype(np.uint64)
    h1, h2, scratch = size * _M1, size * _M2, np.empty(len(length), np.uint64)
    shortest = int(length.min(initial=0))
    for k in range(0, int(length.max(initial=0)), 8):
        if k + 8 <= shortest:  # every string has 8 bytes here: no masking
            _step(h1, h2, window[start + k], scratch)
            continue
        live = np.flatnonzero(length > k)  # strings with bytes left at offset k
        chunk = window[start[live] + k]
        left = np.minimum(length[live] - k, 8).astype(np.uint64)
        chunk &= np.where(left >= 8, _ALL, (np.uint64(1) << (left * np.uint64(8))) - 1)
        one, two = h1[live], h2[live]
        _step(one, two, chunk, scratch[: len(live)])
        h1[live], h2[live] = one, two
    return _finish(h1, scratch), h2


def fingerprints(words: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Two 64-bit hashes of each string of ``words`` (string or large_string; a null counts
    as its bytes, normally empty), computed on the arrow buffers 8 bytes at a time: 128 bits
    that tell distinct ids apart. Strings of one width (common for ids) skip the masking."""
    wide = pa.types.is_large_string(words.type)
    offsets = np.frombuffer(words.buffers()[1], np.int64 if wide else np.int32)
    offsets = offsets[words.offset : words.offset + len(words) + 1].astype(np.int64)
    buffer = words.buffers()[2]
    data = np.frombuffer(buffer, np.uint8) if buffer is not None else np.zeros(0, np.uint8)
    data = data[offsets[0] : offsets[-1]] if len(words) else data[:0]
    n, length = len(words), np.diff(offsets)
    with np.errstate(over="ignore"):
        width = int(length[0]) if n else 0
        if n and len(data) == n * width and bool((length == width).all()):
            return _fixed(data, n, width)
        return _variable(data, offsets[:-1] - offsets[0], length)


def _grown(values: np.ndarray, size: int) -> np.ndarray:
    if size <= len(values):
        return values
    bigger = np.zeros(max(size, 2 * len(values)), values.dtype)
    bigger[: len(values)] = values
    return bigger


class StringIds:
    """String ids -> internal ids 1..N in first-seen order, row by row (repeats allowed).

    A string's first 64 fingerprint bits get a label from pandas' persistent hash table (in
    first-seen order); per label, the other 64 bits, the internal id and the check's code are
    kept in numpy arrays, so a batch costs a hash pass, one table pass and a few gathers. A
    string whose first 64 bits another string already holds (about one pair in 2^64) is
    caught by the other 64 and numbered through a small dict instead.
    """

    def __init__(self) -> None:
        self._labels = UInt64Factorizer(1 << 16)
        self._h2 = np.zeros(1 << 12, np.uint64)  # per label: the second fingerprint
        self._ids = np.zeros(1 << 12, np.int64)  # per label: the internal id (0: rejected)
        self._codes = np.zeros(1 << 12, np.uint8)  # per label: the check's code
        self._clashes: dict[tuple[int, int], tuple[int, int]] = {}  # (h1, h2) -> (id, code)
        self._plain = True  # internal id = label + 1 (no string rejected or clashed yet)
        self.count = 0
        self._words: list[pa.Array] = []

    def ids(self, words: pa.Array) -> np.ndarray:
        """The internal ids of ``words``; strings not met before are numbered on, in their
        order."""
        return self.lookup(words)[0]

    def lookup(self, words: pa.Array, check: Check | None = None) -> tuple:
        """(internal ids, codes or None) of ``words``, one per row. ``check`` sees each new
        distinct string once; those it gives a code are not numbered (id 0), and their rows
        get that code here, every time they come back (codes is None when no row has one)."""
        h1, h2 = fingerprints(words)
        before = self._labels.count
        labels = self._labels.factorize(h1)
        if self._labels.count > before:
            self._number(words, labels, before, h2, check)
        # while every label has its own id, the id is the label + 1: no gather needed
        ids = labels + 1 if self._plain else self._ids[labels]
        clash_codes, clash = None, self._h2[labels] != h2
        if clash.any():
            clash = np.flatnonzero(clash)
            clash_codes = self._clash(words, h1, h2, clash, ids, check)
        if self._plain or not (ids == 0).any():
            return ids, None
        codes = self._codes[labels]
        if clash_codes is not None:
            codes[clash] = clash_codes
        return ids, codes

    def words(self) -> list[str]:
        """Every id, in internal id order."""
        return [w for chunk in self._words for w in chunk.to_pylist()]

    def _number(
        self, words: pa.Array, labels: np.ndarray, before: int, h2: np.ndarray, check: Check | None
    ) -> None:
        """Record the labels new in this batch, numbering the strings the check accepts."""
        after = self._labels.count
        rows = np.flatnonzero(labels >= before)[::-1]
        first = np.empty(after - before, np.int64)
        first[labels[rows] - before] = rows  # reversed: each label's first row writes last
        new = words.take(pa.array(first))
        codes = np.zeros(len(new), np.uint8) if check is None else check(new).astype(np.uint8)
        good = codes == 0
        numbered = np.where(good, self.count + np.cumsum(good), 0)
        self._h2, self._ids = _grown(self._h2, after), _grown(self._ids, after)
        self._codes = _grown(self._codes, after)
        self._h2[before:after] = h2[first]
        self._ids[before:after] = numbered
        self._codes[before:after] = codes
        self._words.append(new.filter(pa.array(good)) if not good.all() else new)
        self.count += int(good.sum())
        self._plain = self._plain and bool(good.all())

    def _clash(
        self,
        words: pa.Array,
        h1: np.ndarray,
        h2: np.ndarray,
        rows: np.ndarray,
        ids: np.ndarray,
        check: Check | None,
    ) -> np.ndarray:
        """Ids (into ``ids``) and codes of the ``rows`` whose string shares its first 64 bits
        with another string: numbered by the full 128 bits, in row order."""
        codes = np.zeros(len(rows), np.uint8)
        for i, row in enumerate(rows.tolist()):
            key = (int(h1[row]), int(h2[row]))
            if key not in self._clashes:
                word = words.slice(row, 1)
                code = 0 if check is None else int(check(word)[0])
                self._clashes[key] = (0 if code else self.count + 1, code)
                if not code:
                    self._words.append(word)
                    self.count += 1
                self._plain = False  # ids no longer follow the labels
            ids[row], codes[i] = self._clashes[key]
        return codes
