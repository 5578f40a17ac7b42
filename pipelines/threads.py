"""Threads for the pipeline's large one-off tensor ops.

The training step runs on ``--torch-threads`` (default 1: its ops are small, and a second
intra-op thread mostly adds synchronisation). Scoring a 1M-item catalog for a block of users,
its top-k, and encoding every item are large ops that split well: they run on every core
this process may use, as numpy's BLAS already does for the scoring matmul.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch


def available_cores() -> int:
    """The cores this process may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op threads set to ``count`` inside the block, restored after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, count))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def all_cores() -> contextlib.AbstractContextManager[None]:
    """``torch_threads`` on every available core, for one large op."""
    return torch_threads(available_cores())
