"""A batch dataloader over parquet: whole chunks in, whole tensor batches out.

Work is per chunk (a parquet row group), never per row. Each epoch shuffles the chunk order.
``workers`` threads each build whole buffers ahead of the consumer: read ``buffer_chunks``
row groups (memory-mapped; each thread has its own file handles) and write every column
straight into one column-major buffer at randomly permuted row positions (one vectorised
scatter per column and chunk, no intermediate copy). The consumer only slices batches out
of finished buffers, zero-copy. Memory holds ``workers + 2`` buffers at most, so datasets
larger than memory stream.

Data-parallel training (``rank`` of ``world``): each epoch, the shuffled chunks are laid end
to end and cut into ``world`` equal runs of rows; a rank reads only the chunks of its run
(the chunk at a cut is read by both neighbours, each keeping its part), so every rank has the
same number of rows and of batches, and no rank reads the others' data. The ``rows % world``
rows beyond the last cut are left out of that epoch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import queue
from collections.abc import Generator, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from core.errors import ConfigError
from pipelines.storage import column_names

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
        workers: threads building buffers ahead of the consumer.
        rank, world: read only the ``rank``-th of ``world`` equal shares of each epoch's
            rows (data-parallel training; ``batch_size`` is then the per-rank batch).

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
        workers: int = 2,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        if batch_size < 1 or buffer_chunks < 1 or workers < 1:
            raise ConfigError("batch_size, buffer_chunks and workers must be >= 1")
        if world < 1 or not 0 <= rank < world:
            raise ConfigError(f"rank {rank} is not one of the {world} ranks")
        if not paths:
            raise ConfigError("the dataloader needs at least one parquet file")
        self.paths = [Path(p) for p in paths]
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.buffer_chunks = buffer_chunks
        self.drop_last = drop_last
        self.seed = seed
        self.workers = workers
        self.rank, self.world = rank, world
        self.epoch = 0
        self.columns = {
            out: [c for g in names for c in column_names(self.paths[0], g)]
            for out, names in groups.items()
        }
        self.dtypes = {
            out: torch.empty(0, dtype=(dtypes or {}).get(out, torch.float32)).numpy().dtype
            for out in groups
        }
        metadata = [pq.ParquetFile(p).metadata for p in self.paths]
        self.chunks = [(f, g) for f, m in enumerate(metadata) for g in range(m.num_row_groups)]
        self.chunk_rows = np.array([metadata[f].row_group(g).num_rows for f, g in self.chunks])
        self.num_rows = sum(m.num_rows for m in metadata) // world  # this rank's rows
        keep_freed_memory()

    def __len__(self) -> int:
        full, rest = divmod(self.num_rows, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def _open(self) -> list[pq.ParquetFile]:
        """One handle per file (a ParquetFile is not safe to share between threads)."""
        return [pq.ParquetFile(path, memory_map=True) for path in self.paths]

    def _share(self, order: np.ndarray) -> list[tuple[int, int, int]]:
        """This rank's ``(chunk, first row, end row)`` pieces of the chunks in ``order``:
        the ``rank``-th of ``world`` equal runs of their rows laid end to end."""
        if self.world == 1:
            return [(int(c), 0, int(self.chunk_rows[c])) for c in order]
        ends = np.cumsum(self.chunk_rows[order])
        begin, end = self.rank * self.num_rows, (self.rank + 1) * self.num_rows
        pieces = []
        for chunk, chunk_end in zip(order, ends, strict=True):
            chunk_begin = chunk_end - self.chunk_rows[chunk]
            first, stop = max(begin, chunk_begin), min(end, chunk_end)
            if first < stop:
                pieces.append((int(chunk), int(first - chunk_begin), int(stop - chunk_begin)))
        return pieces

    def _build_buffer(
        self,
        files: list[pq.ParquetFile],
        pieces: list[tuple[int, int, int]],
        rng: np.random.Generator | None,
    ) -> Batch:
        """Read ``pieces`` (chunk, first row, end row) and write them into column-major
        ``[n_columns, rows]`` arrays, rows at the positions of a random permutation (in
        order without ``rng``)."""
        wanted = [c for names in self.columns.values() for c in names]
        tables = []
        for chunk, first, stop in pieces:
            f, g = self.chunks[chunk]
            table = files[f].read_row_group(g, columns=wanted, use_threads=False)
            whole = first == 0 and stop == self.chunk_rows[chunk]
            tables.append(table if whole else table.slice(first, stop - first))
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        rows = table.num_rows
        positions = rng.permutation(rows) if rng is not None else np.arange(rows)
        buffer = {}
        for out, names in self.columns.items():
            matrix = np.empty((len(names), rows), dtype=self.dtypes[out])
            for row, name in zip(matrix, names, strict=True):
                start = 0
                for piece in table.column(name).chunks:
                    values = piece.to_numpy(zero_copy_only=False)
                    row[positions[start : start + len(values)]] = values
                    start += len(values)
            buffer[out] = torch.from_numpy(matrix)
        return buffer

    def __iter__(self) -> Iterator[Batch]:
        epoch_seed = self.seed + self.epoch
        self.epoch += 1
        rng = np.random.default_rng(epoch_seed)
        order = rng.permutation(len(self.chunks)) if self.shuffle else np.arange(len(self.chunks))
        pieces = self._share(order)
        buffers = [
            pieces[s : s + self.buffer_chunks] for s in range(0, len(pieces), self.buffer_chunks)
        ]

        # Every worker's handles are opened now, so a file replaced during the epoch is never
        # mixed with the one the epoch started on (the old one stays mapped until we finish).
        handles: queue.SimpleQueue[list[pq.ParquetFile]] = queue.SimpleQueue()
        for _ in range(self.workers):
            handles.put(self._open())

        def build(i: int) -> Batch:
            key = [epoch_seed, i] if self.world == 1 else [epoch_seed, i, self.rank]
            shuffle_rng = np.random.default_rng(key) if self.shuffle else None
            files = handles.get()
            try:
                return self._build_buffer(files, buffers[i], shuffle_rng)
            finally:
                handles.put(files)

        executor = ThreadPoolExecutor(self.workers, thread_name_prefix="cascade-loader")
        pending: dict[int, Future[Batch]] = {}
        try:
            ahead = 0
            carry: Batch | None = None
            for i in range(len(buffers)):
                while ahead < len(buffers) and ahead <= i + self.workers:
                    pending[ahead] = executor.submit(build, ahead)
                    ahead += 1
                buffer = pending.pop(i).result()  # popped: the buffer goes once it is served
                carry = yield from self._batches(buffer, carry)
            if carry is not None and not self.drop_last:
                yield {k: v.T for k, v in carry.items()}
        finally:
            executor.shutdown(wait=True, cancel_futures=True)

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
