"""Ids at the serving boundary: what an id in a request may be, and a release's id maps.

Clients and rules files name users and items by the data set's own ids (integers, or strings
such as SKUs and UUIDs); the stages, the store and the streams use the models' internal
integer ids. The gateway translates once, where it receives a request and where it returns
one, with the maps of the version that serves it (``core.ids``: an integer data set's map is
the identity). An id a map does not know gets ``UNKNOWN`` (0, no data set's id): an unknown
user is nobody in the store, an unknown item in no answer. There is no coercion between
kinds: the string ``"42"`` names no item of an integer data set.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import BeforeValidator, Field

from core.errors import ArtifactError
from core.ids import ITEM_ID_MAP, MAX_ID_LENGTH, USER_ID_MAP, IdMap

# The largest integer id accepted: a round bound just under int64's 2**63 - 1 (9.22e18) that
# is exactly a double whose shortest decimal form is itself, so every JSON parser, including
# those that read numbers as doubles, agrees with the server on which ids pass.
INT64_MAX = 9_200_000_000_000_000_000


def _not_a_boolean(value: object) -> object:
    """``true`` is not an id (pydantic would read it as 1)."""
    if isinstance(value, bool):
        raise ValueError("an id is a JSON integer or a string, not a boolean")
    return value


def _not_text(value: object) -> object:
    """The integer branch takes numbers only: a string is a string id or no id, never parsed
    as a number (``"0" * 300`` is too long, not 0)."""
    if isinstance(value, str):
        raise ValueError("a string id is taken as a string")
    return value


# An id as clients and rules files write it: an integer (a JSON number; ``3.0`` is 3, as in
# JSON Schema) or a string of 1..MAX_ID_LENGTH characters. A number stays an int and a string
# a str. The bounds stand before the validators so that the OpenAPI document states them.
Id = Annotated[
    Annotated[int, Field(ge=0, le=INT64_MAX), BeforeValidator(_not_text)]
    | Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH)],
    BeforeValidator(_not_a_boolean),
]


@dataclass(frozen=True)
class ReleaseIds:
    """A release's user and item id maps (``online/user_ids.parquet``, ``item_ids.parquet``;
    the identity where a file is absent: integer data sets)."""

    users: IdMap
    items: IdMap

    @classmethod
    def identity(cls) -> ReleaseIds:
        return cls(IdMap.identity(), IdMap.identity())

    @classmethod
    def load(cls, online: Path, catalog: np.ndarray, unlisted: Container[Path] = ()) -> ReleaseIds:
        """The maps in a release's ``online/`` directory, checked against its ``catalog`` (the
        internal item ids): each id once, and a string item map that names every catalog
        item (``ArtifactError`` otherwise). A file its manifest does not list (``unlisted``)
        is not served, as no unlisted file is (``core.export.verify``). The lookup tables are
        built here, not on the first request."""
        users, items = (
            IdMap.identity() if path in unlisted else IdMap.load(path)
            for path in (online / USER_ID_MAP, online / ITEM_ID_MAP)
        )
        for name, served in ((USER_ID_MAP, users), (ITEM_ID_MAP, items)):
            if not served.unique:
                raise ArtifactError(f"{online / name}: an id appears more than once")
        if (
            items.kind == "str"
            and len(catalog)
            and not 1 <= catalog.min() <= catalog.max() <= len(items)
        ):
            raise ArtifactError(
                f"{online / ITEM_ID_MAP} names {len(items)} items; the catalog's internal ids "
                f"run from {catalog.min()} to {catalog.max()}"
            )
        return cls(users, items)
