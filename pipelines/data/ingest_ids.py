"""One side's ids (users or items) mapped to internal ids while the files stream: integer ids
kept as they are, string ids numbered in first-seen order, bad ids found row by row."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from core.ids import MAX_ID_LENGTH, IdKind, IdMap
from pipelines.data.ingest_problems import Problems, missing_mask
from pipelines.data.reader import Batch, file_format
from pipelines.data.string_ids import StringIds

_EMPTY, _LONG = 1, 2  # why a string id is rejected


def _check_words(words: pa.Array) -> np.ndarray:
    """The rejection code of each new distinct string id (0: a good id)."""
    empty = np.asarray(pc.equal(pc.utf8_trim_whitespace(words), ""), dtype=bool)
    long = np.asarray(pc.greater(pc.utf8_length(words), MAX_ID_LENGTH), dtype=bool)
    return np.where(empty, _EMPTY, np.where(long, _LONG, 0)).astype(np.uint8)


class KindMismatch(Exception):
    """An id column broke the integer guess: start again with string ids."""

    def __init__(self, side: str) -> None:
        super().__init__(side)
        self.side = side


class SideIds:
    """Maps one side's external ids (users or items) to internal ids, batch by batch."""

    def __init__(self, side: str, kind: IdKind) -> None:
        self.side, self.kind = side, kind
        self.known = StringIds()
        self._seen: list[np.ndarray] = []  # integer ids met so far (merged now and then)
        self._table = np.zeros(0, np.int64)  # integer ids of the user or item table
        self._bits = np.zeros(1, bool)  # string ids of the table met: _bits[internal id]
        self._table_count = 0  # string ids numbered by the user or item table

    def map(self, values: pa.Array, batch: Batch, column: str, problems: Problems) -> np.ndarray:
        """The internal ids of ``values`` (0 where an id is bad; the bad rows are noted)."""
        internal, found = self.find(values, batch, column)
        for what, bad in found:
            problems.add(what, batch, bad)
        return internal

    def find(self, values: pa.Array, batch: Batch, column: str) -> tuple[np.ndarray, list]:
        """The internal ids of ``values`` (0 where an id is bad) and the problems found, as
        (what, mask of bad rows) pairs. Only this side's state is touched, so the two sides
        can be mapped in two threads and their problems noted in a fixed order after."""
        what = f"column {column!r}: {self.side} id"
        if self.kind == "int":
            null = missing_mask(values)
            if pa.types.is_string(values.type) and file_format(batch.file) == "csv":
                if not canonical_ints(values):
                    raise KindMismatch(self.side)
                values = values.cast(pa.int64())
            if not pa.types.is_integer(values.type):
                raise KindMismatch(self.side)
            ints = values.cast(pa.int64()).fill_null(0).to_numpy()
            below = (ints <= 0) & ~null
            found = [(f"{what} is null", null), (f"{what} is not >= 1 (0 means unknown)", below)]
            return np.where(ints > 0, ints, 0), found
        if pa.types.is_dictionary(values.type):  # each distinct word once, then per row
            words, codes = self._strings(values.dictionary)
            index = values.indices.fill_null(len(words)).to_numpy()
            internal = np.append(words, 0)[index]
            if codes is not None or values.null_count:
                known = np.zeros(len(words), np.uint8) if codes is None else codes
                codes = np.append(known, _EMPTY)[index]
        else:
            internal, codes = self._strings(values)
        if codes is None:
            return internal, []
        return internal, [
            (f"{what} is null or empty", codes == _EMPTY),
            (f"{what} is longer than {MAX_ID_LENGTH} characters", codes == _LONG),
        ]

    def _strings(self, values: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
        """Internal ids and problem codes (or None) of a text column, row by row."""
        if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
            values = values.cast(pa.string())
        if values.null_count:  # a null is rejected as the empty string is
            values = values.fill_null("")
        return self.known.lookup(values, _check_words)

    def mark_seen(self, internal: np.ndarray) -> None:
        """Note the ids met in the interactions (to count the ids met only in a table)."""
        if self.kind == "int":
            self._seen.append(pd.unique(internal[internal > 0]))
            if len(self._seen) > 16:
                self._seen = [pd.unique(np.concatenate(self._seen))]
            return
        if not self._table_count:  # every string id was numbered here: all of them met
            return
        if len(self._bits) <= self.known.count:
            self._bits = np.concatenate([self._bits, np.zeros(self.known.count + 1, bool)])
        self._bits[internal] = True

    def table_ids(self, internal: np.ndarray) -> None:
        """Note the ids of the user or item table (the integer map has no other record)."""
        if self.kind == "int":
            self._table = np.unique(internal[internal > 0])
        self._table_count = self.known.count  # string ids past this one come from the rows

    def seen_ids(self) -> np.ndarray:
        """The internal ids met in the interactions, ascending."""
        if self.kind == "str":
            table = self._table_count
            marked = np.flatnonzero(self._bits[1 : table + 1]).astype(np.int64) + 1
            return np.concatenate([marked, np.arange(table + 1, self.known.count + 1)])
        return np.unique(np.concatenate([np.zeros(0, np.int64), *self._seen]))

    def internal_ids(self) -> np.ndarray:
        """Every internal id known (table or interactions), ascending."""
        if self.kind == "str":
            return np.arange(1, self.known.count + 1, dtype=np.int64)
        return np.union1d(self._table, self.seen_ids())

    def id_map(self) -> IdMap:
        return IdMap("str", self.known.words()) if self.kind == "str" else IdMap.identity()


def canonical_ints(values: pa.Array) -> bool:
    """Whether every non-null string is a positive integer written plainly (no sign, no
    leading zero), so reading it as an integer loses nothing."""
    plain = pc.match_substring_regex(values.drop_null(), r"^[1-9][0-9]{0,17}$")
    return bool(pc.all(plain).as_py() is not False)
