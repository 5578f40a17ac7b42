"""One registry contract, run against the Redis registry (real server) and the file registry."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from control.registry import (
    FileRegistry,
    LockHeld,
    LockLost,
    RedisRegistry,
    Registry,
    RegistryError,
    VersionState,
    adopt_served,
)
from tests.conftest import redis_url
from tests.unit.control.fake_exports import FAIL, FORCED, PASS, make_version

C, R, K, P, X = (
    VersionState.CANDIDATE,
    VersionState.REJECTED,
    VersionState.CANARY,
    VersionState.PRODUCTION,
    VersionState.RETIRED,
)
ROOT = Path(__file__).resolve().parents[2]
Factory = Callable[[], Registry]


@pytest.fixture(params=["file", pytest.param("redis", marks=pytest.mark.integration)])
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    """Makes registries on one storage: each call is a fresh instance (a restart)."""
    opened: list[Registry] = []
    if request.param == "file":

        def make() -> Registry:
            opened.append(FileRegistry(tmp_path / "registry.json"))
            return opened[-1]

    else:
        url = redis_url(db=13)
        if url is None:
            pytest.skip("no Redis answers (set CASCADE_TEST_REDIS_ADDRESS or start one)")
        import redis

        redis.Redis.from_url(url).flushdb()

        def make() -> Registry:
            opened.append(RedisRegistry(url, namespace="regtest"))
            return opened[-1]

    yield make
    for registry in opened:
        registry.close()


@pytest.fixture
def registry(factory: Factory) -> Registry:
    return factory()


def test_register_sets_candidate_or_rejected_from_the_verdict(registry: Registry) -> None:
    assert registry.register(1, PASS).state is C
    assert registry.register(2, FAIL).state is R
    forced = registry.register(3, FORCED)
    assert forced.state is C and forced.verdict == FORCED
    assert forced.history == [
        {
            "at": forced.created_at,
            "from": None,
            "to": "candidate",
            "reason": forced.history[0]["reason"],
        }
    ]
    assert "forced" in forced.history[0]["reason"]
    assert [r.version for r in registry.records()] == [1, 2, 3]


def test_register_twice_is_idempotent_and_a_new_verdict_revalidates(registry: Registry) -> None:
    first = registry.register(4, PASS)
    again = registry.register(4, dict(PASS))
    assert again == first and len(registry.audit(10)) == 1
    assert registry.register(4, FAIL).state is R  # the gate ran again
    assert registry.get(4).verdict == FAIL  # type: ignore[union-attr]
    registry.transition(4, X, "not wanted")
    with pytest.raises(RegistryError, match="version 4 is retired: its verdict"):
        registry.register(4, PASS)


@pytest.mark.parametrize("verdict", [{}, {"verdict": "maybe"}, None, {"verdict": "pass", "x": {1}}])
def test_register_refuses_a_malformed_verdict(registry: Registry, verdict: object) -> None:
    with pytest.raises(RegistryError, match="version 5"):
        registry.register(5, verdict)  # type: ignore[arg-type]
    assert registry.get(5) is None


def test_promotion_retires_the_old_production_which_stays_previous(registry: Registry) -> None:
    for version in (1, 2, 3):
        registry.register(version, PASS)
    registry.transition(1, P, "first deploy")
    registry.transition(2, K, "canary 5%")
    assert registry.canary() == 2 and registry.previous_production() is None
    registry.transition(2, P, "canary passed")
    assert registry.production() == 2 and registry.previous_production() == 1
    assert registry.get(1).state is X  # type: ignore[union-attr]
    assert registry.get(1).history[-1]["reason"] == "superseded by version 2: canary passed"  # type: ignore[union-attr]
    registry.transition(1, P, "rollback: KPI drop")  # instant rollback
    assert (registry.production(), registry.previous_production()) == (1, 2)
    assert registry.get(2).state is X  # type: ignore[union-attr]
    registry.transition(3, P, "promote directly")
    assert (registry.production(), registry.previous_production()) == (3, 1)


def test_a_transition_to_the_current_state_is_a_no_op(registry: Registry) -> None:
    registry.register(1, PASS)
    registry.transition(1, P, "deploy")
    entries = len(registry.audit(100))
    assert registry.transition(1, P, "deploy again").state is P
    assert len(registry.audit(100)) == entries


@pytest.mark.parametrize(
    ("setup", "version", "to", "message"),
    [
        ([], 9, K, "version 9 is not registered"),
        ([(2, R)], 2, K, "version 2: rejected -> canary is not allowed"),
        ([(2, R)], 2, P, "version 2: rejected -> production is not allowed"),
        ([(1, P)], 1, X, "version 1: production -> retired is not allowed"),
        ([(1, P), (3, X)], 3, P, "only for the previous production"),
        ([(3, X)], 3, K, "version 3: retired -> canary is not allowed"),
        ([(1, K)], 3, K, "version 1 is the canary"),
        ([(1, K)], 1, C, "version 1: canary -> candidate is not allowed"),
    ],
)
def test_refused_transitions_name_the_version_and_states(
    registry: Registry,
    setup: list[tuple[int, VersionState]],
    version: int,
    to: VersionState,
    message: str,
) -> None:
    for number in (1, 3):
        registry.register(number, PASS)
    registry.register(2, FAIL)
    for number, state in setup:
        if state is not R:
            registry.transition(number, state, "setup")
    before = registry.get(version)
    with pytest.raises(RegistryError, match=message):
        registry.transition(version, to, "try")
    assert registry.get(version) == before


def test_state_survives_a_new_instance(factory: Factory) -> None:
    first = factory()
    first.register(1, PASS)
    first.register(2, PASS)
    first.transition(1, P, "deploy")
    first.transition(2, P, "promote")
    first.close()
    second = factory()
    assert [(r.version, r.state) for r in second.records()] == [(1, X), (2, P)]
    assert (second.production(), second.previous_production()) == (2, 1)
    assert second.get(2).verdict == PASS  # type: ignore[union-attr]
    assert len(second.audit(10)) == 5


def test_every_change_is_in_the_audit_log(registry: Registry) -> None:
    registry.register(1, PASS)
    registry.register(2, PASS)
    registry.transition(1, P, "deploy")
    registry.transition(2, K, "canary")
    registry.transition(2, X, "rollback: guardrail")
    registry.forget(2)
    entries = registry.audit(100)
    assert [(e["event"], e["version"], e["from"], e["to"]) for e in entries] == [
        ("register", 1, None, "candidate"),
        ("register", 2, None, "candidate"),
        ("transition", 1, "candidate", "production"),
        ("transition", 2, "candidate", "canary"),
        ("transition", 2, "canary", "retired"),
        ("forget", 2, "retired", None),
    ]
    assert entries[4]["reason"] == "rollback: guardrail" and entries[4]["by"]
    assert [e["version"] for e in registry.audit(2)] == [2, 2]  # the newest, oldest first


def test_forget_removes_a_record_but_never_a_serving_one(registry: Registry) -> None:
    for version in (1, 2, 3, 4):
        registry.register(version, PASS)
    registry.transition(1, P, "deploy")
    registry.transition(2, P, "promote")  # 1 is previous production
    registry.transition(3, K, "canary")
    for serving in (1, 2, 3):
        with pytest.raises(RegistryError, match=f"version {serving} is serving"):
            registry.forget(serving)
    registry.forget(4)
    registry.forget(4)  # unknown: nothing to do
    assert [r.version for r in registry.records()] == [1, 2, 3]


def test_retire_unless_serving_refuses_serving_versions(registry: Registry) -> None:
    for version in (1, 2, 3):
        registry.register(version, PASS)
    registry.transition(1, K, "canary")
    assert registry.retire_unless_serving(1, "gc") is False
    assert registry.get(1).state is K  # type: ignore[union-attr]
    assert registry.retire_unless_serving(2, "gc") is True
    assert registry.get(2).state is X  # type: ignore[union-attr]
    assert registry.retire_unless_serving(99, "gc") is True and registry.get(99) is None


def test_adopt_served_makes_the_newest_complete_version_production(
    registry: Registry, tmp_path: Path
) -> None:
    artifacts = tmp_path / "artifacts"
    assert adopt_served(registry, artifacts) is None
    for version in (1, 2):
        make_version(artifacts, version)
    make_version(artifacts, 3, complete=False)  # an export in progress
    assert adopt_served(registry, artifacts) == 2
    record = registry.get(2)
    assert record is not None and record.state is P and record.verdict is None
    assert record.history[-1]["reason"] == "adopted: first deploy"
    make_version(artifacts, 4)
    assert adopt_served(registry, artifacts) == 2  # a production is recorded: no change
    registry.register(2, PASS)  # a verdict can still be attached to the adopted version
    assert registry.get(2).verdict == PASS  # type: ignore[union-attr]


def test_adopt_served_skips_a_rejected_newest_version(registry: Registry, tmp_path: Path) -> None:
    for version in (1, 2):
        make_version(tmp_path, version)
    registry.register(2, FAIL)
    assert adopt_served(registry, tmp_path) == 1


def test_a_held_lock_names_its_holder_and_is_free_after_the_block(registry: Registry) -> None:
    with registry.lock("retrain", ttl_s=30) as held:
        assert held.until > time.time() + 20
        held_by = r"lock 'retrain' is held by .*:\d+ until 20"
        with pytest.raises(LockHeld, match=held_by), registry.lock("retrain", ttl_s=30):
            pass
        with registry.lock("gc", ttl_s=30):  # another name is another lock
            pass
    with registry.lock("retrain", ttl_s=30):
        pass


def test_a_lock_expires_after_its_ttl_unless_refreshed(registry: Registry) -> None:
    with registry.lock("job", ttl_s=0.5, heartbeat=False) as held:
        for _ in range(3):
            time.sleep(0.3)
            held.refresh()  # heartbeat: still ours after 0.9 s
        with pytest.raises(LockHeld), registry.lock("job", ttl_s=0.5):
            pass
        time.sleep(0.7)  # expired
        with registry.lock("job", ttl_s=30), pytest.raises(LockHeld, match="lock 'job' is held"):
            held.refresh()  # another holder has it now


def test_a_crashed_holder_blocks_nobody_after_its_ttl(factory: Factory, tmp_path: Path) -> None:
    registry = factory()
    if isinstance(registry, RedisRegistry):
        make = f"RedisRegistry({registry.url!r}, {registry.namespace!r})"
    else:
        assert isinstance(registry, FileRegistry)
        make = f"FileRegistry(Path({str(registry.path)!r}))"
    script = textwrap.dedent(f"""
        import os
        from pathlib import Path
        from control.registry import FileRegistry, RedisRegistry
        registry = {make}
        held = registry.lock("retrain", 1.5)  # referenced: not closed (released) by the gc
        held.__enter__()
        os._exit(0)  # crash: never released
    """)
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, timeout=60)
    if isinstance(registry, FileRegistry):  # its pid on this host is dead: free at once
        assert "retrain" in registry._read().locks  # the crash left it
        with registry.lock("retrain", ttl_s=30):
            return
    with pytest.raises(LockHeld, match="until"), registry.lock("retrain", ttl_s=30):
        pass
    time.sleep(1.6)
    with registry.lock("retrain", ttl_s=30):
        pass


def test_a_heartbeat_keeps_the_lock_while_its_holder_is_busy(registry: Registry) -> None:
    with registry.lock("retrain", ttl_s=0.6) as held:
        time.sleep(2.0)  # a long training phase: no refresh call, three ttls
        with pytest.raises(LockHeld, match="lock 'retrain' is held"), registry.lock("retrain", 30):
            pass
        held.check()  # still ours
    with registry.lock("retrain", ttl_s=30):  # released at the end of the block
        pass


def test_a_lock_another_holder_took_is_lost_and_left_to_it(registry: Registry) -> None:
    with registry.lock("rollout", ttl_s=0.6) as held:
        # as if it expired while this holder was frozen, and another one took it
        registry._release_lock("rollout", held.token)
        registry._take_lock("rollout", "intruder", 30)
        time.sleep(0.6)  # the heartbeat finds out (it beats every ttl / 3)
        with pytest.raises(LockLost, match=r"lock 'rollout' is held by .*lost it"):
            held.check()
    with pytest.raises(LockHeld), registry.lock("rollout", ttl_s=30):
        pass  # the block's exit released nothing of the other's


def test_a_holder_stopped_by_sigterm_or_interrupt_releases_the_lock(
    factory: Factory, tmp_path: Path
) -> None:
    registry = factory()
    with pytest.raises(KeyboardInterrupt), registry.lock("gc", ttl_s=30):
        raise KeyboardInterrupt
    with registry.lock("gc", ttl_s=30):
        pass
    if isinstance(registry, RedisRegistry):
        make = f"RedisRegistry({registry.url!r}, {registry.namespace!r})"
    else:
        assert isinstance(registry, FileRegistry)
        make = f"FileRegistry(Path({str(registry.path)!r}))"
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from control.registry import FileRegistry, RedisRegistry
        registry = {make}
        with registry.lock("gc", 30):
            print("held", flush=True)
            time.sleep(60)
    """)
    child = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "held\n"
        child.terminate()  # SIGTERM, as Kubernetes stops a pod
        assert child.wait(timeout=30) == 128 + 15
    finally:
        child.kill()
        child.wait()
    with registry.lock("gc", ttl_s=30):  # released at once, not after its 30 s
        pass
