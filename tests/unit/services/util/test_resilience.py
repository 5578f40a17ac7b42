from __future__ import annotations

import asyncio

import pytest

from services.errors import DependencyUnavailable
from services.settings import BreakerSettings
from services.util.resilience import CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _fail() -> None:
    raise ConnectionError("refused")


async def _ok() -> str:
    return "ok"


async def test_opens_after_consecutive_failures_and_then_fails_fast() -> None:
    clock = Clock()
    breaker = CircuitBreaker("redis", BreakerSettings(failures=2, reset_s=5), clock)
    for _ in range(2):
        with pytest.raises(DependencyUnavailable, match="redis: error"):
            await breaker.call(_fail, 1.0)
    assert breaker.state == "open"
    calls = []

    async def counted() -> str:
        calls.append(1)
        return "ok"

    with pytest.raises(DependencyUnavailable, match="circuit_open"):
        await breaker.call(counted, 1.0)
    assert calls == []  # an open breaker does not even try


async def test_half_open_trial_closes_on_success_and_reopens_on_failure() -> None:
    clock = Clock()
    breaker = CircuitBreaker("triton", BreakerSettings(failures=1, reset_s=5), clock)
    with pytest.raises(DependencyUnavailable):
        await breaker.call(_fail, 1.0)
    clock.now = 6.0
    assert breaker.state == "half_open"
    with pytest.raises(DependencyUnavailable):
        await breaker.call(_fail, 1.0)
    assert breaker.state == "open"
    clock.now = 12.0
    assert await breaker.call(_ok, 1.0) == "ok"
    assert breaker.state == "closed"


async def test_timeout_is_a_failure_with_its_own_reason() -> None:
    breaker = CircuitBreaker("triton", BreakerSettings(failures=3))

    async def slow() -> None:
        await asyncio.sleep(1)

    with pytest.raises(DependencyUnavailable, match="timeout"):
        await breaker.call(slow, 0.01)
    assert breaker.consecutive_failures == 1


async def test_success_resets_the_failure_count() -> None:
    breaker = CircuitBreaker("redis", BreakerSettings(failures=2))
    with pytest.raises(DependencyUnavailable):
        await breaker.call(_fail, 1.0)
    await breaker.call(_ok, 1.0)
    with pytest.raises(DependencyUnavailable):
        await breaker.call(_fail, 1.0)
    assert breaker.state == "closed"


async def test_half_open_admits_one_probe_while_concurrent_callers_fail_fast() -> None:
    clock = Clock()
    breaker = CircuitBreaker("redis", BreakerSettings(failures=1, reset_s=5), clock)
    with pytest.raises(DependencyUnavailable):
        await breaker.call(_fail, 1.0)
    clock.now = 6.0
    release = asyncio.Event()
    calls = []

    async def slow_probe() -> str:
        calls.append(1)
        await release.wait()
        return "ok"

    probe = asyncio.create_task(breaker.call(slow_probe, 5.0))
    await asyncio.sleep(0)  # the probe is in flight
    others = await asyncio.gather(
        *(breaker.call(slow_probe, 5.0) for _ in range(5)), return_exceptions=True
    )
    assert all(isinstance(e, DependencyUnavailable) and e.reason == "circuit_open" for e in others)
    assert calls == [1]  # only the probe reached the dependency
    release.set()
    assert await probe == "ok" and breaker.state == "closed"


async def test_a_cancelled_probe_frees_the_probe_slot() -> None:
    clock = Clock()
    breaker = CircuitBreaker("redis", BreakerSettings(failures=1, reset_s=5), clock)
    with pytest.raises(DependencyUnavailable):
        await breaker.call(_fail, 1.0)
    clock.now = 6.0
    probe = asyncio.create_task(breaker.call(asyncio.Event().wait, 5.0))
    await asyncio.sleep(0)
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    assert await breaker.call(_ok, 1.0) == "ok"  # the next caller may probe


async def test_the_open_breakers_of_a_name_are_counted_on_a_gauge() -> None:
    from prometheus_client import REGISTRY

    def open_now() -> float | None:
        return REGISTRY.get_sample_value("cascade_circuit_breakers_open", {"breaker": "gauge-t"})

    clock = Clock()
    first = CircuitBreaker("gauge-t", BreakerSettings(failures=1, reset_s=5), clock)
    second = CircuitBreaker("gauge-t", BreakerSettings(failures=1, reset_s=5), clock)
    assert open_now() == 0  # the series exists before anything fails
    for breaker, expected in ((first, 1), (second, 2), (first, 2)):  # a failure re-opening:
        with pytest.raises(DependencyUnavailable):  # still one breaker
            await breaker.call(_fail, 1.0)
        assert open_now() == expected
    clock.now = 6.0  # half-open still refuses calls: counted as open
    assert first.state == "half_open" and open_now() == 2
    assert await first.call(_ok, 1.0) == "ok"
    assert open_now() == 1
    assert await second.call(_ok, 1.0) == "ok"
    assert open_now() == 0
