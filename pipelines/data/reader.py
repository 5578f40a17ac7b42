"""One streaming reader for a data set's own files: parquet, CSV and JSON lines (gz allowed).

A path is a file, a directory (read recursively) or a glob. Files are read in path order and
rows in file order, so two runs see the same rows in the same order; each batch comes with its
file and the number of rows before it in that file, which is how errors name a row. Only the
columns asked for are read (parquet and CSV through ``pyarrow.dataset``, JSON lines through
``pyarrow.json``'s streaming reader).
"""

from __future__ import annotations

import glob
import queue
import threading
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.dataset as ds
import pyarrow.json as pjson
import pyarrow.parquet as pq

from core.errors import DataError

SUFFIXES = {
    ".parquet": "parquet",
    ".csv": "csv",
    ".csv.gz": "csv",
    ".jsonl": "jsonl",
    ".jsonl.gz": "jsonl",
    ".ndjson": "jsonl",
    ".ndjson.gz": "jsonl",
}
BATCH_ROWS = 1 << 20  # rows per batch: large enough for vectorised work, small for memory
_JSON_BLOCK = 16 << 20  # bytes per JSON block (a line must fit in one)
# batches arrow decodes ahead of the caller: enough for two cores, and bounded, since the
# caller (the ingest) is slower than the read and arrow's default would hold 16 x 4 batches
_READAHEAD = {"batch_readahead": 4, "fragment_readahead": 1}


def file_format(path: Path) -> str | None:
    """``parquet``, ``csv`` or ``jsonl`` from the file's name; None for other files."""
    name = path.name.lower()
    return next((fmt for suffix, fmt in SUFFIXES.items() if name.endswith(suffix)), None)


def list_files(path: Path) -> list[Path]:
    """The data files ``path`` names (a file, a directory read recursively, or a glob),
    sorted by path; DataError when there are none."""
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = [p for p in path.rglob("*") if p.is_file() and file_format(p)]
    else:
        files = [Path(p) for p in glob.glob(str(path), recursive=True)]
        files = [p for p in files if p.is_file() and file_format(p)]
    if not files:
        kinds = ", ".join(sorted(SUFFIXES))
        raise DataError(path, f"no data files found (looked for {kinds})")
    unknown = [p for p in files if not file_format(p)]
    if unknown:
        raise DataError(unknown[0], f"unknown file type (expected one of {sorted(SUFFIXES)})")
    return sorted(files)


@dataclass(frozen=True)
class Batch:
    """Rows of one file: ``offset`` rows of that file came before them."""

    file: Path
    offset: int
    data: pa.RecordBatch


def file_schema(path: Path, delimiter: str = ",") -> pa.Schema:
    """The columns of one file and their types (CSV and JSON lines: inferred from the first
    block)."""
    fmt = file_format(path)
    try:
        if fmt == "parquet":
            return pq.read_schema(path)
        if fmt == "csv":
            return _csv_dataset(path, delimiter, {}).schema
        with _json_reader(path, None) as reader:
            return reader.schema
    except (OSError, pa.ArrowException) as error:
        raise DataError(path, f"cannot read: {error}") from None


def _csv_dataset(path: Path, delimiter: str, types: Mapping[str, pa.DataType]) -> ds.Dataset:
    fmt = ds.CsvFileFormat(
        parse_options=pcsv.ParseOptions(delimiter=delimiter),
        convert_options=pcsv.ConvertOptions(column_types=dict(types), strings_can_be_null=True),
        read_options=pcsv.ReadOptions(block_size=16 << 20),
    )
    return ds.dataset(str(path), format=fmt)


def _json_reader(path: Path, schema: pa.Schema | None) -> pjson.JSONStreamingReader:
    compression = "gzip" if path.name.lower().endswith(".gz") else None
    stream = pa.input_stream(str(path), compression=compression)
    parse = pjson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer")
    return pjson.open_json(stream, pjson.ReadOptions(block_size=_JSON_BLOCK), parse)


def _missing(path: Path, found: list[str], columns: list[str]) -> None:
    missing = [c for c in columns if c not in found]
    if missing:
        raise DataError(path, f"column {missing[0]!r} is missing (columns found: {found})")


def _batches(
    path: Path, columns: list[str], delimiter: str, types: Mapping[str, pa.DataType]
) -> Iterator[pa.RecordBatch]:
    """The batches of one CSV or JSON lines file."""
    if file_format(path) == "jsonl":
        with _json_reader(path, None) as reader:
            _missing(path, list(reader.schema.names), columns)
            for batch in reader:
                yield batch.select(columns)
        return
    dataset = _csv_dataset(path, delimiter, {c: t for c, t in types.items() if c in columns})
    _missing(path, list(dataset.schema.names), columns)
    yield from dataset.to_batches(columns=columns, batch_size=BATCH_ROWS)


def read_batches(
    files: list[Path],
    columns: list[str],
    delimiter: str = ",",
    csv_types: Mapping[str, pa.DataType] | None = None,
    plain: Collection[str] = (),
) -> Iterator[Batch]:
    """The rows of ``files`` in order, ``columns`` only (DataError naming the file for a
    missing column or an unreadable file). ``csv_types`` fixes the type of CSV columns whose
    inferred type would lose information (ids with leading zeros, codes that look numeric).
    Parquet text columns come as dictionary arrays, except those in ``plain`` (columns of
    many distinct values, such as ids, where building a dictionary costs more than it
    saves). The next batches are read by a thread while the caller works on this one."""
    yield from _prefetched(_read(files, columns, delimiter, csv_types or {}, set(plain)))


def _read(
    files: list[Path],
    columns: list[str],
    delimiter: str,
    csv_types: Mapping[str, pa.DataType],
    plain: set[str],
) -> Iterator[Batch]:
    for group in _groups(files, columns):
        offsets = dict.fromkeys(map(str, group), 0)
        path = group[0]
        try:
            for path, data in _group_batches(group, columns, delimiter, csv_types, plain):
                if data.num_rows:
                    yield Batch(path, offsets[str(path)], data)
                    offsets[str(path)] += data.num_rows
        except (OSError, pa.ArrowException) as error:
            raise DataError(path, f"cannot read after row {offsets[str(path)]}: {error}") from None


def _groups(files: list[Path], columns: list[str]) -> Iterator[list[Path]]:
    """Runs of consecutive parquet files whose columns have the same types (scanned as one
    data set, so arrow reads ahead across files); every other file on its own."""
    run: list[Path] = []
    kinds: object = None
    for path in files:
        if file_format(path) == "parquet":
            try:
                schema = pq.read_schema(path)
            except (OSError, pa.ArrowException) as error:
                raise DataError(path, f"cannot read: {error}") from None
            _missing(path, list(schema.names), columns)
            these = [schema.field(c).type for c in columns]
            if run and these == kinds:
                run.append(path)
                continue
            if run:
                yield run
            run, kinds = [path], these
            continue
        if run:
            yield run
        run, kinds = [], None
        yield [path]
    if run:
        yield run


def _group_batches(
    group: list[Path],
    columns: list[str],
    delimiter: str,
    types: Mapping[str, pa.DataType],
    plain: set[str],
) -> Iterator[tuple[Path, pa.RecordBatch]]:
    if file_format(group[0]) != "parquet":
        for data in _batches(group[0], columns, delimiter, types):
            yield group[0], data
        return
    # text columns as dictionaries: parquet stores them so, and ids map per distinct value
    schema = pq.read_schema(group[0])
    text = [c for c in columns if pa.types.is_string(schema.field(c).type) and c not in plain]
    options = ds.ParquetReadOptions(dictionary_columns=text)
    fmt = ds.ParquetFileFormat(read_options=options)
    dataset = ds.dataset([str(p) for p in group], format=fmt)
    scanner = dataset.scanner(columns=columns, batch_size=BATCH_ROWS, **_READAHEAD)
    for tagged in scanner.scan_batches():  # in file order, rows in file order
        yield Path(tagged.fragment.path), tagged.record_batch


_DONE = object()


def _prefetched(batches: Iterator[Batch], depth: int = 2) -> Iterator[Batch]:
    """``batches``, read ahead by a thread (arrow decodes without the GIL), at most ``depth``
    waiting; an error in the thread is raised here."""
    ready: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for batch in batches:
                while not stop.is_set():
                    try:
                        ready.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            ready.put(_DONE)
        except BaseException as error:  # handed to the consumer
            ready.put(error)

    thread = threading.Thread(target=produce, name="cascade-read", daemon=True)
    thread.start()
    try:
        while (item := ready.get()) is not _DONE:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()
