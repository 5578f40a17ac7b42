from __future__ import annotations

from pathlib import Path

from control.retrain.state import StateDir, recover


def _version(root: Path, version: int, complete: bool = True) -> None:
    (root / "releases" / str(version)).mkdir(parents=True)
    (root / "model_repository" / "ranker" / str(version)).mkdir(parents=True)
    if complete:
        (root / "releases" / str(version) / "manifest.json").write_text("{}")


def _journal(state: StateDir, run: str, version: int | None) -> dict:
    for stream in ("feedback", "impressions"):
        path = state.snapshot_path(run, stream)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    journal = {
        "run": run,
        "cursor": {"feedback": "9-0", "impressions": "8-0"},
        "skipped": {"feedback:bad_type": 2},
        "after_version": 1,
        "version": version,
    }
    state.write_journal(journal)
    return journal


def test_a_registered_run_is_rolled_forward(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "retrain")
    _version(tmp_path, 2)
    _journal(state, "r1", 2)
    recover(state, tmp_path, lambda v: v == 2, lambda _: None)
    committed = state.load()
    assert committed.snapshots == ["r1"] and committed.cursor["feedback"] == "9-0"
    assert committed.skipped == {"feedback:bad_type": 2}
    assert state.snapshot_path("r1", "feedback").is_file() and state.journal() is None
    assert (tmp_path / "releases" / "2").is_dir()


def test_an_unregistered_run_is_rolled_back(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "retrain")
    _version(tmp_path, 1)  # older, registered or not: untouched
    _version(tmp_path, 2)  # the killed run's export
    _version(tmp_path, 3, complete=False)  # half-written by it
    _journal(state, "r1", 2)
    logged: list[str] = []
    recover(state, tmp_path, lambda v: False, logged.append)
    assert sorted(p.name for p in (tmp_path / "releases").iterdir()) == ["1"]
    assert not (tmp_path / "model_repository" / "ranker" / "2").exists()
    assert state.load().snapshots == [] and state.load().cursor["feedback"] == "0-0"
    assert not state.snapshot_path("r1", "feedback").exists() and state.journal() is None
    assert any("removed unregistered version 2" in line for line in logged)


def test_orphan_snapshots_are_removed(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "retrain")
    _journal(state, "old", None)
    state.commit(state.journal() or {})
    state.snapshot_path("killed", "feedback").write_bytes(b"x")
    recover(state, tmp_path, lambda v: False, lambda _: None)
    assert sorted(p.name for p in state.snapshots.iterdir()) == [
        "old-feedback.parquet",
        "old-impressions.parquet",
    ]
