"""The retrain job's durable state under ``<artifacts>/retrain/``.

- ``state.json``: the committed stream cursor (last stream id consumed per stream) and the
  committed snapshots, oldest first. Training data = base data set + every committed
  snapshot + this run's new one.
- ``snapshots/<run>-<stream>.parquet``: the logged entries of one run, written atomically.
- ``journal.json``: the run in flight: its snapshot, the cursor it would commit, the newest
  version that existed before its export and, once exported, its version.

The cursor and the snapshot are committed only after the version is registered, so a crash
never loses or double-counts events: an uncommitted snapshot is deleted and read again from
the committed cursor. ``recover`` (run under the lock before anything else) finishes what a
killed run left: if its version was registered, the commit is rolled forward; otherwise its
version (and any incomplete version it was writing) is removed and its snapshot deleted.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.export.repository import MANIFEST
from core.files import write_json

STATE = "state.json"
JOURNAL = "journal.json"
STREAM_NAMES = ("feedback", "impressions")


@dataclass
class RetrainState:
    cursor: dict[str, str] = field(default_factory=lambda: dict.fromkeys(STREAM_NAMES, "0-0"))
    snapshots: list[str] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # totals over committed snapshots


class StateDir:
    """Reads and writes the files above."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.snapshots = directory / "snapshots"
        self.work = directory / "work"

    def load(self) -> RetrainState:
        path = self.directory / STATE
        if not path.is_file():
            return RetrainState()
        raw = json.loads(path.read_text())
        return RetrainState(
            cursor={**dict.fromkeys(STREAM_NAMES, "0-0"), **raw.get("cursor", {})},
            snapshots=list(raw.get("snapshots", [])),
            skipped=dict(raw.get("skipped", {})),
        )

    def snapshot_path(self, run: str, stream: str) -> Path:
        return self.snapshots / f"{run}-{stream}.parquet"

    def journal(self) -> dict[str, Any] | None:
        path = self.directory / JOURNAL
        return json.loads(path.read_text()) if path.is_file() else None

    def write_journal(self, journal: dict[str, Any]) -> None:
        write_json(self.directory / JOURNAL, journal)

    def commit(self, journal: dict[str, Any]) -> RetrainState:
        """Add the journal's snapshot and cursor to the committed state; end the journal."""
        state = self.load()
        if journal["run"] not in state.snapshots:
            state.snapshots.append(journal["run"])
            for reason, count in journal.get("skipped", {}).items():
                state.skipped[reason] = state.skipped.get(reason, 0) + int(count)
        state.cursor.update(journal["cursor"])
        write_json(
            self.directory / STATE,
            {"cursor": state.cursor, "snapshots": state.snapshots, "skipped": state.skipped},
        )
        (self.directory / JOURNAL).unlink(missing_ok=True)
        return state

    def discard(self, journal: dict[str, Any]) -> None:
        """Forget an uncommitted run: its snapshot files and the journal."""
        for stream in STREAM_NAMES:
            self.snapshot_path(journal["run"], stream).unlink(missing_ok=True)
        (self.directory / JOURNAL).unlink(missing_ok=True)

    def remove_orphans(self) -> list[str]:
        """Snapshot files of no committed run (a run killed before its journal existed)."""
        committed = set(self.load().snapshots)
        removed = []
        for path in sorted(self.snapshots.glob("*.parquet")) if self.snapshots.is_dir() else []:
            if path.name.rsplit("-", 1)[0] not in committed:
                path.unlink()
                removed.append(path.name)
        for path in self.snapshots.glob(".*.tmp") if self.snapshots.is_dir() else []:
            path.unlink()
        return removed


def remove_version(root: Path, version: int) -> None:
    """Delete every directory of ``version`` (release first: it is what makes it complete)."""
    shutil.rmtree(root / "releases" / str(version), ignore_errors=True)
    models = root / "model_repository"
    for model in models.iterdir() if models.is_dir() else []:
        shutil.rmtree(model / str(version), ignore_errors=True)
        for staged in model.glob(f".staging-{version}-*"):
            shutil.rmtree(staged, ignore_errors=True)


def leftover_versions(root: Path, journal: dict[str, Any]) -> list[int]:
    """Versions a killed run left: its exported version, and incomplete versions (no
    manifest) newer than the newest version that existed before its export."""
    found = set()
    if journal.get("version") is not None:
        found.add(int(journal["version"]))
    after = journal.get("after_version")
    if after is not None:
        releases = root / "releases"
        for path in releases.iterdir() if releases.is_dir() else []:
            if path.name.isdigit() and int(path.name) > after and not (path / MANIFEST).is_file():
                found.add(int(path.name))
    return sorted(found)


def recover(
    state_dir: StateDir,
    root: Path,
    is_registered: Callable[[int], bool],
    log: Callable[[str], None],
) -> None:
    """Finish what a killed run left (see the module docstring)."""
    journal = state_dir.journal()
    if journal is not None:
        version = journal.get("version")
        if version is not None and is_registered(int(version)):
            state_dir.commit(journal)
            log(
                f"recovered: version {version} of run {journal['run']} was registered; "
                "its snapshot is now committed"
            )
        else:
            for leftover in leftover_versions(root, journal):
                if not is_registered(leftover):
                    remove_version(root, leftover)
                    log(f"recovered: removed unregistered version {leftover} of a killed run")
            state_dir.discard(journal)
            log(f"recovered: discarded the uncommitted snapshot of run {journal['run']}")
    for name in state_dir.remove_orphans():
        log(f"recovered: removed orphan snapshot {name}")
