"""A batch dataloader over parquet: whole chunks in, whole tensor batches out.

Work is per chunk (a parquet row group), never per row. Each epoch shuffles the chunk order;
a background thread reads the next ``buffer_chunks`` row groups (memory-mapped, decoded by
pyarrow's own threads) while the current buffer is served. The consumer side writes the
decoded columns straight into one column-major buffer at shuffled positions (one
``index_copy_`` per column and chunk; no intermediate copy), then yields batches as
zero-copy slices. Memory holds about two buffers, so datasets larger than memory stream.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import queue
import threading
import warnings
from collections.abc import Generator, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from pipelines.errors import ConfigError
from pipelines.storage import column_names

_DONE = object()
Batch = dict[str, torch.Tensor]


def keep_freed_memory() -> None:
    """Ask glibc to reuse freed buffer memory instead of returning it to the kernel.

    Each shuffle buffer is tens of MB; by default glibc maps and unmaps such blocks, and
    the page faults of touching fresh pages cost more than the shuffle itself. Raising the
    mmap and trim thresholds makes buffers come from (and go back to) the heap.
    """
    name = ctypes.util.find_library("c")
    if not name:
        return
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "mallopt"):  # not glibc
        return
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)
    libc.mallopt(m_trim_threshold, 2 * 1024 * 1024 * 1024 - 1)
    libc.mallopt(m_top_pad, 256 * 1024 * 1024)


class ParquetBatchLoader:
    """Yield ``{name: tensor[batch, n_columns]}`` batches from parquet files.

    Args:
        paths: parquet files written by ``storage.write_parquet`` (same schema).
        groups: output name -> column groups (a group expands to its numbered columns).
        batch_size: rows per batch.
        shuffle: shuffle chunk order each epoch and rows within each buffer.
        buffer_chunks: row groups per shuffle buffer.
        dtypes: output name -> torch dtype (default float32).
        drop_last: drop the final partial batch.
        seed: base seed; epoch ``e`` uses ``seed + e``.
        shuffle_block: rows moved together by the in-buffer shuffle. 1 (default) permutes
            single rows; 16 moves runs of 16 rows (one 64-byte cache line of an int32
            column), which is several times cheaper. With rows stored in random order (as
            ``cascade train`` writes them) batches stay random samples of the buffer.

    Batch tensors are column-major views (``batch[name][:, j]`` is contiguous) and stay
    valid after later batches are drawn.
    """

    def __init__(
        self,
        paths: Sequence[Path],
        groups: Mapping[str, Sequence[str]],
        batch_size: int,
        shuffle: bool = True,
        buffer_chunks: int = 4,
        dtypes: Mapping[str, torch.dtype] | None = None,
        drop_last: bool = False,
        seed: int = 0,
        shuffle_block: int = 1,
    ) -> None:
        if batch_size < 1 or buffer_chunks < 1 or shuffle_block < 1:
            raise ConfigError("batch_size, buffer_chunks and shuffle_block must be >= 1")
        if not paths:
            raise ConfigError("the dataloader needs at least one parquet file")
        self.paths = [Path(p) for p in paths]
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.buffer_chunks = buffer_chunks
        self.drop_last = drop_last
        self.seed = seed
        self.shuffle_block = shuffle_block
        self.epoch = 0
        self.columns = {
            out: [c for g in names for c in column_names(self.paths[0], g)]
            for out, names in groups.items()
        }
        self.dtypes = {out: (dtypes or {}).get(out, torch.float32) for out in groups}
        files = [pq.ParquetFile(p, memory_map=True) for p in self.paths]
        self.chunks = [(f, g) for f in files for g in range(f.metadata.num_row_groups)]
        self.num_rows = sum(f.metadata.num_rows for f in files)
        keep_freed_memory()

    def __len__(self) -> int:
        full, rest = divmod(self.num_rows, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def _read(self, order: np.ndarray, out: queue.Queue[object]) -> None:
        """Producer: read buffers of row groups in ``order`` and put them on ``out``."""
        wanted = [c for names in self.columns.values() for c in names]
        try:
            for start in range(0, len(order), self.buffer_chunks):
                chosen = (self.chunks[i] for i in order[start : start + self.buffer_chunks])
                tables = [
                    file.read_row_group(group, columns=wanted, use_threads=True)
                    for file, group in chosen
                ]
                out.put(pa.concat_tables(tables) if len(tables) > 1 else tables[0])
        except BaseException as error:  # handed to the consumer, which re-raises it
            out.put(error)
        out.put(_DONE)

    def _columns(self, table: pa.Table, out: str, piece: int) -> list[torch.Tensor]:
        """One chunk's columns of output ``out`` as 1-D tensors, without copying when the
        stored dtype is the requested one."""
        dtype = torch.empty(0, dtype=self.dtypes[out]).numpy().dtype
        with warnings.catch_warnings():  # arrow memory is read-only; it is only read here
            warnings.simplefilter("ignore", UserWarning)
            return [
                torch.from_numpy(
                    np.asarray(
                        table.column(name).chunk(piece).to_numpy(zero_copy_only=False), dtype=dtype
                    )
                )
                for name in self.columns[out]
            ]

    def _shuffled_buffer(self, table: pa.Table, generator: torch.Generator | None) -> Batch:
        """Write the table into column-major ``[n_columns, rows]`` tensors in shuffled order.

        Rows move in runs of ``shuffle_block``: each chunk, viewed as ``[runs, block]`` per
        column, is written to randomly drawn run slots by one ``index_copy_`` per column; a
        chunk's last ``rows % block`` rows go to the end. Without a generator, in order.
        """
        block = self.shuffle_block if generator is not None else 1
        first = table.column(0)
        sizes = [len(first.chunk(i)) for i in range(first.num_chunks)]
        runs = [size // block for size in sizes]
        total_runs = sum(runs)
        slots = (
            torch.randperm(total_runs, generator=generator)
            if generator is not None
            else torch.arange(total_runs)
        )
        buffer = {}
        for out, names in self.columns.items():
            matrix = torch.empty((len(names), table.num_rows), dtype=self.dtypes[out])
            body = matrix[:, : total_runs * block]
            slot_at, tail_at = 0, total_runs * block
            for piece, (size, n_runs) in enumerate(zip(sizes, runs, strict=True)):
                whole = n_runs * block
                destination = slots[slot_at : slot_at + n_runs]
                for j, column in enumerate(self._columns(table, out, piece)):
                    body[j].view(-1, block).index_copy_(
                        0, destination, column[:whole].view(-1, block)
                    )
                    matrix[j, tail_at : tail_at + size - whole] = column[whole:]
                slot_at += n_runs
                tail_at += size - whole
            buffer[out] = matrix
        return buffer

    def __iter__(self) -> Iterator[Batch]:
        epoch_seed = self.seed + self.epoch
        self.epoch += 1
        rng = np.random.default_rng(epoch_seed)
        generator = torch.Generator().manual_seed(epoch_seed) if self.shuffle else None
        order = rng.permutation(len(self.chunks)) if self.shuffle else np.arange(len(self.chunks))
        tables: queue.Queue[object] = queue.Queue(maxsize=1)
        reader = threading.Thread(target=self._read, args=(order, tables), daemon=True)
        reader.start()
        carry: Batch | None = None
        try:
            while (item := tables.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, pa.Table)
                buffer = self._shuffled_buffer(item, generator)
                carry = yield from self._batches(buffer, carry)
            if carry is not None and not self.drop_last:
                yield {k: v.T for k, v in carry.items()}
        finally:
            while reader.is_alive():  # unblock the producer if the consumer stopped early
                try:
                    tables.get_nowait()
                except queue.Empty:
                    reader.join(timeout=0.01)

    def _batches(self, buffer: Batch, carry: Batch | None) -> Generator[Batch, None, Batch | None]:
        """Yield full batches of ``buffer`` (after completing ``carry``); return the rest."""
        rows = next(iter(buffer.values())).shape[1]
        offset = 0
        if carry is not None:
            kept = next(iter(carry.values())).shape[1]
            offset = min(self.batch_size - kept, rows)
            carry = {k: torch.cat([carry[k], v[:, :offset]], dim=1) for k, v in buffer.items()}
            if kept + offset < self.batch_size:
                return carry
            yield {k: v.T for k, v in carry.items()}
        full = offset + (rows - offset) // self.batch_size * self.batch_size
        for start in range(offset, full, self.batch_size):
            yield {k: v[:, start : start + self.batch_size].T for k, v in buffer.items()}
        return {k: v[:, full:] for k, v in buffer.items()} if full < rows else None
