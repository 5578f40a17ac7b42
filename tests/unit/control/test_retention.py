"""Retention on fake export trees with the file registry (the Redis rows: integration tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from control import retention
from control.registry import FileRegistry, Registry, VersionState
from control.retention import Plan, RetentionError, collect_garbage, plan_garbage
from core.errors import ConfigError
from tests.unit.control.fake_exports import FAIL, PASS, leftovers, make_version, on_disk

P, K = VersionState.PRODUCTION, VersionState.CANARY


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    return tmp_path / "artifacts"


@pytest.fixture
def registry(artifacts: Path) -> Registry:
    return FileRegistry(artifacts / "registry.json")


def _export(artifacts: Path, registry: Registry, versions: range, verdict: dict = PASS) -> None:
    for version in versions:
        make_version(artifacts, version)
        registry.register(version, verdict)


def _gc(registry: Registry, artifacts: Path, keep: int, **options: object) -> list[int]:
    return collect_garbage(registry, artifacts, keep, None, "cascade", **options)  # type: ignore[arg-type]


def test_serving_versions_survive_keep_zero(artifacts: Path, registry: Registry) -> None:
    _export(artifacts, registry, range(1, 7))
    registry.transition(2, P, "deploy")
    registry.transition(4, P, "promote")  # 2 is the previous production
    registry.transition(5, K, "canary")
    assert _gc(registry, artifacts, keep=0) == [1, 3]
    for version in (2, 4, 5, 6):  # production, previous, canary, the newest
        assert on_disk(artifacts, version) and registry.get(version) is not None
    assert not on_disk(artifacts, 1) and not on_disk(artifacts, 3)
    assert [r.version for r in registry.records()] == [2, 4, 5, 6]
    forgotten = [e for e in registry.audit(100) if e["event"] == "forget"]
    assert [(e["version"], e["from"]) for e in forgotten] == [(1, "retired"), (3, "retired")]
    assert leftovers(artifacts) == []


def test_the_n_newest_others_are_kept_whatever_their_state(
    artifacts: Path, registry: Registry
) -> None:
    _export(artifacts, registry, range(1, 7))
    _export(artifacts, registry, range(7, 8), FAIL)  # rejected, newest
    for version in (1, 2, 3):
        registry.transition(version, P, "deploy")  # 3 production, 2 previous, 1 retired
    assert _gc(registry, artifacts, keep=2) == [1, 4, 5]
    assert sorted(r.version for r in registry.records()) == [2, 3, 6, 7]


def test_versions_the_registry_never_knew(artifacts: Path, registry: Registry) -> None:
    make_version(artifacts, 1)  # exported before the registry existed
    _export(artifacts, registry, range(2, 5))
    registry.transition(3, P, "deploy")
    make_version(artifacts, 5)  # exported, not registered yet (the job is validating it)
    make_version(artifacts, 6, complete=False)  # an export in progress
    plan = plan_garbage(registry, artifacts, keep=1)
    assert plan == Plan(remove=[1, 2], serving=[3], kept=[4], unregistered=[5, 6], newest=6)
    assert _gc(registry, artifacts, keep=1) == [1, 2]
    assert [v for v in range(1, 7) if on_disk(artifacts, v)] == [3, 4, 5, 6]


def test_with_no_production_recorded_the_latest_complete_version_is_kept(
    artifacts: Path, registry: Registry
) -> None:
    _export(artifacts, registry, range(1, 4))
    make_version(artifacts, 4, complete=False)  # half-written, registered never
    registry.register(4, PASS)  # (a registry that lies: incomplete versions are not kept)
    plan = plan_garbage(registry, artifacts, keep=0)
    assert plan.serving == [3] and plan.remove == [1, 2]


def test_protected_versions_are_kept(artifacts: Path, registry: Registry) -> None:
    _export(artifacts, registry, range(1, 5))
    registry.transition(4, P, "deploy")
    assert _gc(registry, artifacts, keep=0, protect=[1]) == [2, 3]
    assert on_disk(artifacts, 1)


def test_dry_run_removes_nothing(artifacts: Path, registry: Registry) -> None:
    _export(artifacts, registry, range(1, 5))
    registry.transition(4, P, "deploy")
    before = (registry.records(), registry.audit(100))
    assert _gc(registry, artifacts, keep=0, dry_run=True) == [1, 2, 3]
    assert all(on_disk(artifacts, v) for v in range(1, 5))
    assert (registry.records(), registry.audit(100)) == before


def test_a_crash_midway_is_finished_by_the_next_run(
    artifacts: Path, registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    _export(artifacts, registry, range(1, 5))
    registry.transition(4, P, "deploy")
    real = retention._remove_tree

    def crash(path: Path) -> None:
        raise RetentionError(f"crash removing {path}")

    monkeypatch.setattr(retention, "_remove_tree", crash)
    with pytest.raises(RetentionError, match="crash removing"):
        _gc(registry, artifacts, keep=0)
    assert registry.get(1).state is VersionState.RETIRED  # type: ignore[union-attr]
    assert leftovers(artifacts)  # renamed, not removed
    assert not (artifacts / "model_repository" / "query_tower" / "1").exists()
    monkeypatch.setattr(retention, "_remove_tree", real)
    assert _gc(registry, artifacts, keep=0) == [1, 2, 3]
    assert leftovers(artifacts) == [] and not any(on_disk(artifacts, v) for v in (1, 2, 3))
    assert [r.version for r in registry.records()] == [4]


def test_a_version_that_starts_serving_meanwhile_is_kept(
    artifacts: Path, registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    _export(artifacts, registry, range(1, 4))
    registry.transition(3, P, "deploy")
    stale = plan_garbage(registry, artifacts, keep=0)
    registry.transition(1, K, "canary")  # between the plan and the removal
    monkeypatch.setattr(retention, "plan_garbage", lambda *args: stale)
    assert _gc(registry, artifacts, keep=0) == [2]
    assert on_disk(artifacts, 1) and registry.get(1).state is K  # type: ignore[union-attr]


def test_keep_must_not_be_negative(artifacts: Path, registry: Registry) -> None:
    with pytest.raises(ConfigError, match="keep must be >= 0"):
        _gc(registry, artifacts, keep=-1)
