"""Retention: remove old exported versions, their Redis embedding rows and their records.

Kept, whatever ``keep`` is:

- what is serving: the production version, the previous production (instant rollback), the
  canary, and any version the caller names (``protect``: e.g. a replica's pinned
  ``CASCADE_MODEL_VERSION``); with no production recorded, the newest complete version (what
  an unpinned gateway serves);
- versions on disk newer than every registered one (an export the job has not registered
  yet), and the newest version on disk (so a version number is never reused);
- the ``keep`` newest complete versions among the rest, whatever their state.

Everything else goes, registered or not, oldest first. Removing one version is crash-safe
and resumable: (1) its record turns "retired" in one atomic step that refuses a serving
version, (2) the ``{ns}:emb:v{v}:tables`` marker goes (the version then reads as "not in
Redis"), then its rows (SCAN + UNLINK in batches), (3) each directory is renamed to
``.deleting-<v>`` and removed, model directories first, ``releases/<v>`` (with the manifest)
last, (4) the record is forgotten. A rerun after a crash finds the retired record (or the
incomplete directories, or ``.deleting-*`` leftovers) and finishes. Runs hold the registry
lock ``gc``; online-store feature keys are not per version (``{ns}:s{SCHEMA}:...``), so
there are none to remove.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from control.registry import Registry
from core.errors import CascadeError, ConfigError
from core.export.repository import complete_versions, latest_version

log = logging.getLogger(__name__)

LOCK = "gc"
LOCK_TTL_S = 30.0  # renewed by the lock's heartbeat; a killed run blocks the next this long
DELETING = ".deleting-"
SCAN_COUNT = 5_000
UNLINK_BATCH = 1_000


class RetentionError(CascadeError):
    """Removing a version's rows or files failed; a rerun finishes the job."""


@dataclass
class Plan:
    """What one retention pass keeps and removes (versions, oldest first)."""

    remove: list[int] = field(default_factory=list)
    serving: list[int] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)  # the ``keep`` newest others
    unregistered: list[int] = field(default_factory=list)  # newer than every record
    newest: int | None = None


def disk_versions(artifacts: Path) -> set[int]:
    """Every version with a directory, complete or not."""
    found = set()
    for parent in [artifacts / "releases", *(artifacts / "model_repository").glob("*")]:
        if parent.is_dir():
            found |= {int(p.name) for p in parent.iterdir() if p.name.isdigit() and p.is_dir()}
    return found


def plan_garbage(
    registry: Registry, artifacts: Path, keep: int, protect: Iterable[int] = ()
) -> Plan:
    """Decide what a pass with ``keep`` would remove (see the module docstring)."""
    if keep < 0:
        raise ConfigError(f"keep must be >= 0, got {keep}")
    known = {record.version for record in registry.records()}
    serving = registry.serving() | set(protect)
    if registry.production() is None and (latest := latest_version(artifacts)) is not None:
        serving.add(latest)
    on_disk = disk_versions(artifacts)
    complete = set(complete_versions(artifacts))
    unregistered = {v for v in on_disk - known if v > max(known, default=0)}
    newest = max(on_disk, default=None)
    others = sorted((known | on_disk) - serving - unregistered, reverse=True)
    kept = [v for v in others if v in complete][:keep]
    remove = set(others) - set(kept) - {newest}
    return Plan(sorted(remove), sorted(serving), sorted(kept), sorted(unregistered), newest)


def collect_garbage(
    registry: Registry,
    artifacts: Path,
    keep: int,
    redis_url: str | None,
    namespace: str,
    dry_run: bool = False,
    protect: Iterable[int] = (),
) -> list[int]:
    """Remove the versions ``plan_garbage`` picks; return them (with ``dry_run``: what
    would go, touching nothing). ``redis_url``/``namespace`` are the embedding rows'."""
    if dry_run:
        return plan_garbage(registry, artifacts, keep, protect).remove
    removed = []
    with registry.lock(LOCK, LOCK_TTL_S) as lock:
        plan = plan_garbage(registry, artifacts, keep, protect)
        rows = _EmbeddingRows(redis_url, namespace) if redis_url else None
        try:
            for version in plan.remove:
                lock.check()  # a run that lost its lock removes nothing more
                reason = f"gc: beyond retention (keep {keep})"
                if not registry.retire_unless_serving(version, reason):
                    log.warning("version %d started serving meanwhile: kept", version)
                    continue
                if rows is not None:
                    rows.delete(version)
                remove_directories(artifacts, version)
                registry.forget(version)
                removed.append(version)
                log.info("removed version %d", version)
            for leftover in _leftovers(artifacts):
                _remove_tree(leftover)
        finally:
            if rows is not None:
                rows.close()
    return removed


def remove_directories(artifacts: Path, version: int) -> None:
    """Rename each directory of ``version`` to ``.deleting-<v>``, then remove it; model
    directories first, the release (whose manifest makes a version complete) last."""
    models = sorted(p for p in (artifacts / "model_repository").glob(f"*/{version}") if p.is_dir())
    for directory in [*models, artifacts / "releases" / str(version)]:
        doomed = directory.with_name(f"{DELETING}{version}")
        if doomed.exists():  # an earlier run crashed after renaming
            _remove_tree(doomed)
        if directory.exists():
            directory.rename(doomed)
            _remove_tree(doomed)


def _leftovers(artifacts: Path) -> list[Path]:
    pattern = f"{DELETING}*"
    return [
        *(artifacts / "releases").glob(pattern),
        *(artifacts / "model_repository").glob(f"*/{pattern}"),
    ]


def _remove_tree(path: Path) -> None:
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError as error:
        raise RetentionError(f"removing {path} failed: {error}; rerun `cascade gc`") from None


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class _EmbeddingRows:
    """Deletes a version's embedding rows (``services.embedding_cache.backing`` keys)."""

    def __init__(self, url: str, namespace: str) -> None:
        self.url, self.namespace = url, namespace
        self._client: Any = None

    def delete(self, version: int) -> int:
        """Marker first (the version then reads as not stored), then every row; returns the
        keys removed."""
        from redis.exceptions import RedisError

        from core.redact import redact_url
        from services.util.redis_client import sync_client

        prefix = f"{self.namespace}:emb:v{version}:"
        try:
            if self._client is None:
                self._client = sync_client(self.url, 30.0)  # a RedisCluster scans every node
            removed = int(self._client.unlink(prefix + "tables"))
            batch: list[bytes] = []
            for key in self._client.scan_iter(match=_glob_escape(prefix) + "*", count=SCAN_COUNT):
                batch.append(key)
                if len(batch) >= UNLINK_BATCH:
                    removed += int(self._client.unlink(*batch))
                    batch.clear()
            if batch:
                removed += int(self._client.unlink(*batch))
        except RedisError as error:
            raise RetentionError(
                f"deleting version {version}'s embedding rows in {redact_url(self.url)} "
                f"failed: {error}; rerun `cascade gc`"
            ) from None
        log.info("version %d: %d Redis keys removed", version, removed)
        return removed

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
