"""The background batch builder that feeds a GPU step (``read_ahead``, ``prefetched``)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from pipelines.training.loop import prefetched, read_ahead


def test_items_come_in_order_prepared_by_another_thread() -> None:
    built_on: set[str] = set()

    def prepare(item: int) -> int:
        built_on.add(threading.current_thread().name)
        return item * 10

    assert list(read_ahead(range(50), depth=2, prepare=prepare)) == [i * 10 for i in range(50)]
    assert built_on == {"cascade-read-ahead"}


def test_it_builds_no_more_than_depth_items_ahead() -> None:
    built: list[int] = []

    def prepare(item: int) -> int:
        built.append(item)
        return item

    items = read_ahead(range(100), depth=2, prepare=prepare)
    assert next(items) == 0
    time.sleep(0.3)
    # the consumed item, the two queued ones and the one waiting to be queued
    assert len(built) <= 4
    items.close()


def test_a_loader_error_is_raised_in_the_consumer_after_the_good_items() -> None:
    def broken() -> object:
        yield 1
        yield 2
        raise ValueError("bad parquet row group")

    items = read_ahead(broken(), depth=2)
    assert next(items) == 1
    assert next(items) == 2
    with pytest.raises(ValueError, match="bad parquet row group"):
        next(items)


def test_closing_early_stops_the_thread() -> None:
    def endless() -> object:
        n = 0
        while True:
            n += 1
            yield n

    before = threading.active_count()
    items = read_ahead(endless(), depth=2)
    assert [next(items) for _ in range(5)] == [1, 2, 3, 4, 5]
    items.close()
    assert threading.active_count() == before


def test_on_the_cpu_batches_are_used_as_built() -> None:
    batches = [(torch.ones(2), torch.zeros(3))]
    before = threading.active_count()
    items = prefetched(batches, torch.device("cpu"))
    assert next(items) is batches[0]  # the same object: not copied, not pinned
    assert threading.active_count() == before  # no thread on the CPU
