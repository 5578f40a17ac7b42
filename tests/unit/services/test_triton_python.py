"""Helpers of the Triton model.py files: output tensors and the cache's metrics mirror."""

from __future__ import annotations

import ctypes
import sys
from typing import Any, ClassVar

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.embedding_cache.triton_metrics import TritonMetricsMirror
from services.inference.ranker_batch import RankerInputs, RankerOutputs
from services.inference.triton_python import (
    input_array,
    output_tensor,
    ranker_inputs,
    ranker_response,
)

_set_name = ctypes.pythonapi.PyCapsule_SetName
_set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]


class StubTensor:
    """Consumes a DLPack producer the way the wheel's python-backend stub does: takes the
    capsule, renames it ``used_dlpack`` and keeps the data."""

    def __init__(self, name: str, capsule: Any, data: np.ndarray) -> None:
        self.name, self.capsule, self.data = name, capsule, data

    @classmethod
    def from_dlpack(cls, name: str, producer: Any) -> StubTensor:
        capsule = producer.__dlpack__(stream=None)
        data = np.from_dlpack(producer).copy()
        _set_name(capsule, b"used_dlpack")
        return cls(name, capsule, data)


def test_an_output_tensor_consumed_by_the_stub_raises_nothing_when_freed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    array = np.arange(6, dtype=np.float32).reshape(3, 2)
    tensor = output_tensor(StubTensor, "score", array)
    np.testing.assert_array_equal(tensor.data, array)
    del tensor  # the capsule's destructor runs here
    assert unraisable == []
    # what model.py did before: a numpy capsule's destructor fails on the stub's rename
    StubTensor.from_dlpack("score", array)
    assert unraisable and "incorrect name" in str(unraisable[0].exc_value)


def test_input_array_reads_a_dlpack_tensor() -> None:
    array = np.arange(4, dtype=np.int64)
    np.testing.assert_array_equal(input_array(array), array)


class FakeMetric:
    def __init__(self) -> None:
        self.value = 0.0

    def increment(self, value: float) -> None:
        self.value += value

    def set(self, value: float) -> None:
        self.value = value


class FakeFamily:
    COUNTER = "counter"
    GAUGE = "gauge"
    created: ClassVar[dict[str, FakeFamily]] = {}

    def __init__(self, name: str, description: str, kind: str) -> None:
        assert kind in (self.COUNTER, self.GAUGE)
        self.name, self.kind, self.metrics = name, kind, {}
        FakeFamily.created[name] = self

    def Metric(self, labels: dict[str, str]) -> FakeMetric:  # noqa: N802 (pb_utils' name)
        return self.metrics.setdefault(tuple(sorted(labels.items())), FakeMetric())


class FakePbUtils:
    MetricFamily = FakeFamily


def test_the_mirror_sends_what_counters_gained_with_their_names_and_labels() -> None:
    FakeFamily.created = {}
    lookups = Counter(
        "cascade_embedding_cache_lookups_total", "doc", ["tier", "result"], registry=None
    )
    registry = CollectorRegistry()
    registry.register(lookups)
    mirror = TritonMetricsMirror(FakePbUtils(), [lookups], interval_s=3600)
    lookups.labels(tier="device", result="hit").inc(5)
    mirror.sync()
    lookups.labels(tier="device", result="hit").inc(2)
    lookups.labels(tier="host", result="miss").inc(1)
    mirror.sync()  # within the interval: nothing sent
    family = FakeFamily.created["cascade_embedding_cache_lookups_total"]
    assert family.metrics[(("result", "hit"), ("tier", "device"))].value == 5
    mirror.sync(force=True)
    assert family.metrics[(("result", "hit"), ("tier", "device"))].value == 7
    assert family.metrics[(("result", "miss"), ("tier", "host"))].value == 1
    assert set(FakeFamily.created) == {"cascade_embedding_cache_lookups_total"}


def test_the_mirror_sends_a_histogram_as_its_cumulative_bucket_count_and_sum_series() -> None:
    FakeFamily.created = {}
    seconds = Histogram("lookup_seconds", "doc", buckets=(0.001, 0.01), registry=None)
    mirror = TritonMetricsMirror(FakePbUtils(), [seconds], interval_s=3600)
    for value in (0.0005, 0.005, 0.05):
        seconds.observe(value)
    mirror.sync(force=True)
    seconds.observe(0.0002)
    mirror.sync(force=True)
    buckets = FakeFamily.created["lookup_seconds_bucket"].metrics
    assert {labels[0][1]: metric.value for labels, metric in buckets.items()} == {
        "0.001": 2,
        "0.01": 3,
        "+Inf": 4,
    }
    assert FakeFamily.created["lookup_seconds_count"].metrics[()].value == 4
    assert FakeFamily.created["lookup_seconds_sum"].metrics[()].value == pytest.approx(0.0557)
    assert "lookup_seconds_created" not in FakeFamily.created


class FakeResponsePbUtils:
    """The parts of ``pb_utils`` the ranker's adapter uses."""

    class TritonError:
        def __init__(self, message: str) -> None:
            self.message = message

    class InferenceResponse:
        def __init__(self, tensors: list | None = None, error: Any = None) -> None:
            self.tensors, self.error = tensors or [], error

    Tensor = StubTensor

    @staticmethod
    def get_input_tensor_by_name(request: dict, name: str) -> np.ndarray:
        return request[name]


def test_ranker_inputs_are_read_or_their_error_returned() -> None:
    sparse, dense = np.ones((2, 3), np.int64), np.zeros((2, 4), np.float32)
    read = ranker_inputs(FakeResponsePbUtils, {"sparse": sparse, "dense": dense})
    assert isinstance(read, RankerInputs)
    np.testing.assert_array_equal(read.sparse, sparse)
    missing = ranker_inputs(FakeResponsePbUtils, {"sparse": sparse})
    assert isinstance(missing, KeyError)


def test_a_ranker_response_carries_scores_and_flags_or_the_error() -> None:
    ok = ranker_response(FakeResponsePbUtils, RankerOutputs(np.arange(3, dtype=np.float32), True))
    assert ok.error is None and [t.name for t in ok.tensors] == ["score", "degraded"]
    np.testing.assert_array_equal(ok.tensors[0].data, np.arange(3, dtype=np.float32)[:, None])
    np.testing.assert_array_equal(ok.tensors[1].data, np.ones((3, 1), np.float32))
    failed = ranker_response(FakeResponsePbUtils, ValueError("dense must be [N, 26]"))
    assert failed.tensors == [] and failed.error.message == "dense must be [N, 26]"


def test_the_mirror_sets_gauges_to_their_current_value() -> None:
    FakeFamily.created = {}
    opened = Gauge("breakers_open", "doc", ["breaker"], registry=None)
    mirror = TritonMetricsMirror(FakePbUtils(), [opened], interval_s=3600)
    opened.labels(breaker="embedding_cache_redis").set(2)
    mirror.sync(force=True)
    opened.labels(breaker="embedding_cache_redis").set(0)
    mirror.sync(force=True)
    family = FakeFamily.created["breakers_open"]
    assert family.kind == FakeFamily.GAUGE
    assert family.metrics[(("breaker", "embedding_cache_redis"),)].value == 0
