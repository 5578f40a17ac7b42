"""A data set's own ids (SKUs, UUIDs, slugs, or integers) and the integer ids the models use.

Integer ids stay themselves (the map is the identity, nothing is stored) and stay integers
in answers. String ids get internal ids 1..N in the order they were first met; a later
version extends the map (``extended``) and never renumbers, so the streams, the registry
and every release agree on what an internal id means. Internal id 0 means unknown.

Saved as a one-column parquet file (``external``: row ``i`` holds internal id ``i + 1``);
no pickle.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from core.errors import ArtifactError

MAX_ID_LENGTH = 256  # characters of a string id; longer ones are refused (422 in the API)
UNKNOWN = 0
USER_ID_MAP = "user_ids.parquet"  # file names in a release's online/ directory
ITEM_ID_MAP = "item_ids.parquet"

IdKind = Literal["int", "str"]
ExternalId = int | str


class IdMap:
    """External ids <-> internal int64 ids (module docs)."""

    def __init__(self, kind: IdKind, external: Sequence[str] | None = None) -> None:
        self.kind: IdKind = kind
        values = list(external or [])
        if kind == "int" and values:
            raise ValueError("an integer id map is the identity and holds no values")
        self.external = np.asarray(values, dtype=object)
        self._index = pd.Index(self.external, dtype=object) if kind == "str" else None

    @classmethod
    def identity(cls) -> IdMap:
        return cls("int")

    @classmethod
    def of(cls, values: Iterable[str]) -> IdMap:
        """A string map over ``values`` in first-seen order (duplicates kept once)."""
        return cls("str", list(dict.fromkeys(values)))

    def __len__(self) -> int:
        return len(self.external)

    @property
    def unique(self) -> bool:
        """Whether each id appears once (an integer map always: it holds none)."""
        return self._index is None or bool(self._index.is_unique)

    def one(self, value: ExternalId) -> int:
        """The internal id of one external id (``UNKNOWN``: not in the map, or the other
        kind); the request path's single lookup, without building arrays."""
        if self._index is None:
            return value if type(value) is int and value > 0 else UNKNOWN
        if not isinstance(value, str):
            return UNKNOWN
        try:
            return int(self._index.get_loc(value)) + 1  # row i holds internal id i + 1
        except KeyError:
            return UNKNOWN

    def extended(self, values: Iterable[str]) -> IdMap:
        """This map plus the ``values`` it lacks, appended (existing ids keep theirs)."""
        if self.kind == "int":
            return self
        known = set(self.external.tolist())
        new = [v for v in dict.fromkeys(values) if v not in known]
        return IdMap("str", [*self.external.tolist(), *new]) if new else self

    def to_internal(self, values: Iterable[ExternalId]) -> np.ndarray:
        """Internal ids of ``values`` (int64); ``UNKNOWN`` for ids the map lacks, and for ids
        of the other kind (a string where the data set's ids are integers, and back)."""
        values = list(values)
        if self.kind == "int":
            known = [v if type(v) is int and v > 0 else UNKNOWN for v in values]
            return np.asarray(known, dtype=np.int64)
        assert self._index is not None
        strings = [v if isinstance(v, str) else None for v in values]
        positions = self._index.get_indexer(pd.Index(strings, dtype=object)) if values else []
        return np.asarray(positions, dtype=np.int64) + 1  # -1 (absent) -> 0 (unknown)

    def to_external(self, internal: Iterable[int]) -> list[ExternalId]:
        """The external ids of internal ids (which must be known)."""
        ids = np.asarray(internal if isinstance(internal, np.ndarray) else list(internal))
        ids = ids.astype(np.int64, copy=False)
        if self.kind == "int":
            return list(ids.tolist())
        return list(self.external[ids - 1].tolist())

    def save(self, path: Path) -> None:
        """Write the map (string maps only; the identity needs no file)."""
        if self.kind == "str":
            table = pa.table({"external": pa.array(self.external.tolist(), pa.string())})
            pq.write_table(table, path)

    @classmethod
    def load(cls, path: Path) -> IdMap:
        """The map saved at ``path``; the identity when there is no file (integer ids)."""
        if not path.exists():
            return cls.identity()
        try:
            column = pq.read_table(path, columns=["external"]).column("external")
        except (OSError, KeyError, pa.ArrowException) as error:
            raise ArtifactError(f"{path}: not an id map ({error})") from None
        return cls("str", column.to_pylist())
