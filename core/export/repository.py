"""Versioned, never-overwriting layout of exported artifacts.

    <root>/model_repository/<model>/<version>/...   Triton models (query_tower, ranker)
    <root>/releases/<version>/...                  index, item ids, popularity, workflow,
                                                   manifest.json (written last)

A version is claimed by creating ``releases/<version>`` (atomic ``mkdir``); each model
directory is built under a staging name and renamed into place, so a reader never sees a
half-written version, and an existing version is never touched. A version without
``manifest.json`` is incomplete and ignored by ``latest_version``.

The manifest's ``files`` table (sha256 of every file of the version, release and model
directories alike, keyed by the path relative to the root) is what ``verify`` checks on load.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from core.errors import ArtifactError
from core.export.verify import MANIFEST, file_sha256


def _versions(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def next_version(root: Path) -> int:
    """One more than any version present in any part of the repository."""
    seen = _versions(root / "releases")
    models = root / "model_repository"
    if models.is_dir():
        for model in models.iterdir():
            seen += _versions(model)
    return max(seen, default=0) + 1


def complete_versions(root: Path) -> list[int]:
    """Versions with a manifest, oldest first."""
    releases = root / "releases"
    return [v for v in _versions(releases) if (releases / str(v) / MANIFEST).is_file()]


def latest_version(root: Path) -> int | None:
    """The newest version with a manifest, or None."""
    return max(complete_versions(root), default=None)


def sha256(path: Path) -> str:
    """The file's sha256 (the same chunked reader the loaders verify with)."""
    return file_sha256(path)


class VersionWriter:
    """Claims a new version and publishes model directories and the release into it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.version = 0
        self.release: Path | None = None
        self.published: list[Path] = []

    def claim(self) -> int:
        """Reserve the next version number (retrying if another export takes it first)."""
        (self.root / "releases").mkdir(parents=True, exist_ok=True)
        for _ in range(100):
            version = next_version(self.root)
            try:
                (self.root / "releases" / str(version)).mkdir()
            except FileExistsError:
                continue
            self.version, self.release = version, self.root / "releases" / str(version)
            return version
        raise ArtifactError(f"{self.root}: could not claim a new version")

    def staging(self, model: str) -> Path:
        """A fresh staging directory for ``model``'s files of this version."""
        path = self.root / "model_repository" / model / f".staging-{self.version}-{os.getpid()}"
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        return path

    def publish(self, model: str, staged: Path) -> Path:
        """Rename the staged directory to ``<model>/<version>``; never replaces an existing one."""
        target = self.root / "model_repository" / model / str(self.version)
        if target.exists():
            raise ArtifactError(f"{target} already exists; exports never overwrite a version")
        staged.rename(target)
        self.published.append(target)
        return target

    def finish(self, manifest: dict[str, Any]) -> Path:
        """Record checksums of every file and write the manifest last."""
        assert self.release is not None, "claim first"
        files = {}
        for base in [self.release, *self.published]:
            for path in sorted(p for p in base.rglob("*") if p.is_file()):
                files[str(path.relative_to(self.root))] = sha256(path)
        manifest = {**manifest, "version": self.version, "files": files}
        temporary = self.release / f".{MANIFEST}.tmp"
        temporary.write_text(json.dumps(manifest, indent=2, sort_keys=True))
        temporary.rename(self.release / MANIFEST)
        return self.release / MANIFEST

    def abandon(self) -> None:
        """Remove what this (failed) export published; earlier versions are untouched."""
        for path in [*self.published, *([self.release] if self.release else [])]:
            shutil.rmtree(path, ignore_errors=True)
        for staged in (self.root / "model_repository").glob(
            f"*/.staging-{self.version}-{os.getpid()}"
        ):
            shutil.rmtree(staged, ignore_errors=True)
