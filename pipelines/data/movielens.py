"""MovieLens-100K, read from the files the ``recbole==1.2.1`` wheel ships.

The wheel is installed with ``--no-deps`` as a pure data carrier; this module never imports
``recbole``, it only finds the package directory and parses the tab-separated atomic files.
Every parse error names the file and the line.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from core.errors import DataError
from pipelines.data.schema import GENRE_SEPARATOR, RawDataset

_MISSING_YEAR = {"", "unknown", "unkonwn"}  # the shipped file spells it "unkonwn" once
_YEAR_IN_TITLE = re.compile(r"\((\d{4})\)\s*$")

_HEADERS = {
    "ml-100k.user": [
        "user_id:token",
        "age:token",
        "gender:token",
        "occupation:token",
        "zip_code:token",
    ],
    "ml-100k.item": [
        "item_id:token",
        "movie_title:token_seq",
        "release_year:token",
        "class:token_seq",
    ],
    "ml-100k.inter": ["user_id:token", "item_id:token", "rating:float", "timestamp:float"],
}


def default_directory() -> Path:
    """Where the recbole wheel keeps ml-100k, without importing recbole."""
    spec = importlib.util.find_spec("recbole")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            "recbole/dataset_example/ml-100k",
            "MovieLens-100K not found: install the data carrier with "
            "`pip install --no-deps recbole==1.2.1`",
        )
    return Path(next(iter(spec.submodule_search_locations))) / "dataset_example" / "ml-100k"


def _rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """Yield (line number, fields) after checking the typed header."""
    if not path.is_file():
        raise DataError(path, "file is missing")
    expected = _HEADERS[path.name]
    with path.open(encoding="utf-8") as handle:
        header = handle.readline().rstrip("\n").split("\t")
        if header != expected:
            raise DataError(path, f"header {header} differs from {expected}", line=1)
        for number, line in enumerate(handle, start=2):
            line = line.rstrip("\n")
            if not line:
                continue
            fields = line.split("\t")
            if len(fields) != len(expected):
                raise DataError(
                    path,
                    f"expected {len(expected)} tab-separated fields, found {len(fields)}",
                    line=number,
                )
            yield number, fields


def _parse(
    path: Path, field: str, value: str, number: int, cast: Callable[[str], object]
) -> object:
    try:
        return cast(value)
    except ValueError:
        raise DataError(
            path, f"{field} {value!r} is not a valid {cast.__name__}", line=number
        ) from None


def _read_users(path: Path) -> pd.DataFrame:
    rows = [
        (_parse(path, "user_id", f[0], n, int), _parse(path, "age", f[1], n, int), f[2], f[3], f[4])
        for n, f in _rows(path)
    ]
    users = pd.DataFrame(rows, columns=["user_id", "age", "gender", "occupation", "zip_code"])
    return users.astype({"user_id": "int64", "age": "int32"})


def _parse_year(path: Path, title: str, value: str, number: int) -> float:
    """The release year; one shipped row has the year only in its title, e.g. "... (1995)"."""
    if value.isdigit():
        return float(value)
    in_title = _YEAR_IN_TITLE.search(title)
    if in_title:
        return float(in_title.group(1))
    if value.strip().lower() in _MISSING_YEAR:
        return float("nan")
    raise DataError(path, f"release_year {value!r} is not a year", line=number)


def _read_items(path: Path) -> pd.DataFrame:
    rows = []
    for n, f in _rows(path):
        year = _parse_year(path, f[1], f[2], n)
        genres = GENRE_SEPARATOR.join(g for g in f[3].split(" ") if g and g != "unknown")
        rows.append((_parse(path, "item_id", f[0], n, int), f[1], year, genres))
    items = pd.DataFrame(rows, columns=["item_id", "title", "year", "genres"])
    return items.astype({"item_id": "int64", "year": "float32"})


def _read_interactions(path: Path) -> pd.DataFrame:
    columns: list[list[object]] = [[], [], [], []]
    for n, f in _rows(path):
        columns[0].append(_parse(path, "user_id", f[0], n, int))
        columns[1].append(_parse(path, "item_id", f[1], n, int))
        rating = _parse(path, "rating", f[2], n, float)
        if not 1 <= rating <= 5:  # type: ignore[operator]
            raise DataError(path, f"rating {f[2]!r} is outside 1..5", line=n)
        columns[2].append(rating)
        columns[3].append(_parse(path, "timestamp", f[3], n, float))
    return pd.DataFrame(
        {
            "user_id": np.asarray(columns[0], dtype=np.int64),
            "item_id": np.asarray(columns[1], dtype=np.int64),
            "rating": np.asarray(columns[2], dtype=np.float32),
            "timestamp": np.asarray(columns[3], dtype=np.float64).astype(np.int64),
        }
    )


def load_movielens_100k(directory: Path | None = None) -> RawDataset:
    """Read users, items and ratings; raise DataError naming the file and line on bad input."""
    directory = directory or default_directory()
    users = _read_users(directory / "ml-100k.user")
    items = _read_items(directory / "ml-100k.item")
    interactions = _read_interactions(directory / "ml-100k.inter")
    for table, column, known, name in (
        (interactions, "user_id", users["user_id"], "ml-100k.user"),
        (interactions, "item_id", items["item_id"], "ml-100k.item"),
    ):
        unknown = ~table[column].isin(known)
        if unknown.any():
            first = int(np.flatnonzero(unknown.to_numpy())[0])
            raise DataError(
                directory / "ml-100k.inter",
                f"{column} {int(table[column].iloc[first])} is not in {name}",
                line=first + 2,
            )
    return RawDataset("ml-100k", users, items, interactions)
