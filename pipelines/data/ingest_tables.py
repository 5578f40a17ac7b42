"""The user and item tables of a dataset file: read whole, features in their stored types,
duplicate keys with conflicting attributes refused."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from core.errors import DataError
from core.features.schema import Feature
from pipelines.data.dataset_file import TableSpec
from pipelines.data.ingest_ids import SideIds
from pipelines.data.ingest_problems import Problems, example_row, missing_mask
from pipelines.data.ingest_values import as_floats
from pipelines.data.reader import Batch, list_files, read_batches

SEPARATORS = ("|", ";", ",", "/", "\x1f")  # tried in order for stored multi-categorical values
_BOOLS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}
_BOOLS |= {"t": True, "f": False, "y": True, "n": False}


def _feature(values: pa.Array, feature: Feature, batch: Batch, problems: Problems) -> pa.Array:
    """A feature column in its stored type (multi-categorical: a list of strings), the rows
    of the wrong type noted."""
    what = f"column {feature.name!r}: {feature.kind} feature"
    null = missing_mask(values)
    nested = pa.types.is_list(values.type) or pa.types.is_large_list(values.type)
    if (nested and feature.kind != "multi_categorical") or pa.types.is_struct(values.type):
        problems.add(f"{what} holds {values.type} values", batch, ~null)
        return pa.nulls(len(values), pa.string())
    if feature.kind == "numeric":
        numbers = as_floats(values)
        problems.add(f"{what} holds a value that is not a number", batch, np.isnan(numbers) & ~null)
        return pa.array(numbers, pa.float64())
    if feature.kind == "bool":
        if pa.types.is_boolean(values.type):
            return values
        text = [None if v is None else str(v).strip().lower() for v in values.to_pylist()]
        words = [None if t is None else _BOOLS.get(t) for t in text]
        bad = np.array([w is None for w in words]) & ~null
        problems.add(f"{what} holds a value that is not true/false", batch, bad)
        return pa.array(words, pa.bool_())
    if feature.kind == "categorical":
        return values.cast(pa.string())
    if nested:
        return values.cast(pa.list_(pa.string()))
    if feature.separator is None:
        problems.add(f"{what} holds text: give its `separator:`", batch, ~null)
        return pa.nulls(len(values), pa.list_(pa.string()))
    sep = feature.separator
    lists = [
        None if s is None else [t.strip() for t in s.split(sep) if t.strip()]
        for s in values.cast(pa.string()).to_pylist()
    ]
    return pa.array(lists, pa.list_(pa.string()))


def _separator(lists: pa.ChunkedArray, name: str) -> str:
    """A separator no value of a multi-categorical column contains."""
    flat = pc.list_flatten(lists)
    for sep in SEPARATORS:
        if not pc.any(pc.match_substring(flat, sep)).as_py():
            return sep
    raise DataError(name, f"every separator {SEPARATORS} occurs in a value")


@dataclass
class Table:
    """A user or item table: internal id and stored features, one row per key."""

    frame: pd.DataFrame
    separators: dict[str, str]
    files: list[Path]


def read_table(path: Path, spec: TableSpec, features: tuple[Feature, ...], ids: SideIds) -> Table:
    """A user or item table at ``path`` (its key mapped by ``ids``, its features checked and
    normalised); DataError naming the file, column and first bad row."""
    files = list_files(path)
    text = {f.name: pa.string() for f in features if f.kind != "numeric" and f.kind != "bool"}
    types = text | {spec.key: pa.string()}
    batches = list(read_batches(files, spec.columns, spec.delimiter, types))
    if not batches:
        raise DataError(path, "the table has no rows")
    problems = Problems()
    columns: dict[str, list[Any]] = {"id": [], **{f.name: [] for f in features}}
    for batch in batches:
        internal = ids.map(batch.data.column(spec.key), batch, spec.key, problems)
        columns["id"].append(pa.array(internal))
        for f in features:
            columns[f.name].append(_feature(batch.data.column(f.name), f, batch, problems))
    problems.raise_first()
    table = pa.table({k: pa.chunked_array(v) for k, v in columns.items()})
    multi = [f.name for f in features if f.kind == "multi_categorical"]
    separators = {name: _separator(table[name], name) for name in multi}
    frame = pd.DataFrame({"id": table["id"].to_numpy()})
    for f in features:
        values = table[f.name]
        if f.name in separators:
            values = pc.binary_join(values, separators[f.name]).fill_null("")
        frame[f.name] = values.to_pandas()
    frame["where"] = [(b, i) for b, batch in enumerate(batches) for i in range(batch.data.num_rows)]
    _check_duplicates(frame, batches, spec.key)
    ids.table_ids(frame["id"].to_numpy())
    return Table(frame.drop_duplicates("id").drop(columns="where"), separators, files)


def _check_duplicates(frame: pd.DataFrame, batches: list[Batch], key: str) -> None:
    """Duplicate keys are fine when their attributes agree; DataError when they differ."""
    distinct = frame.drop(columns="where").astype(str).drop_duplicates()
    conflict = distinct["id"].duplicated(keep=False)
    if conflict.any():
        first = distinct["id"][conflict].iloc[0]
        one, two = (frame["where"][r] for r in distinct.index[distinct["id"] == first][:2])
        raise DataError(
            batches[two[0]].file,
            f"column {key!r}: a key appears twice with different attributes "
            f"({example_row(batches[one[0]], one[1])}; {example_row(batches[two[0]], two[1])})",
        )
