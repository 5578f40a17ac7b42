"""Verification of exported artifacts against the sha256 table of their release manifest.

``releases/<v>/manifest.json`` records, under ``files``, the sha256 of every file of version
``v`` keyed by its path relative to the export root: the release's own files and those of
``model_repository/<model>/<v>/``. Every loader checks the files it serves before reading
them, so a corrupted file (even one of the same size) is refused with its name instead of
being served as normal recommendations.

Decisions:

- A listed file that is missing, or whose sha256 differs, raises
  ``ArtifactVerificationError`` naming it (expected vs actual digest, shortened).
- A file present but not listed is logged and otherwise ignored: loaders read only fixed
  names or names given by a listed spec file, so an unlisted file is never served.
- A version with no sha256 table (a manifest without ``files``, or a model directory with no
  release manifest beside it) is loaded *unverified*, with a warning: every export this
  project ever wrote records the table, so such a version was assembled by hand (a test, a
  model repository copied away from its releases) and refusing it protects no real export.
- Files are hashed in 1 MiB chunks, in a few threads (hashlib releases the GIL); a digest is
  remembered for the life of the process while the file's path, inode, size, mtime and ctime
  are unchanged, so one process hashes a file once even when the gateway, the in-process
  models and ``materialize`` all check it. Any write to the file invalidates the memory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from core.errors import ArtifactError

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
CHUNK = 1 << 20
SHORT = 12  # digest characters shown in messages
IGNORED_DIRECTORIES = frozenset({"__pycache__"})  # Triton's python backend writes bytecode


class ArtifactVerificationError(ArtifactError):
    """A file of an exported version is missing or differs from its manifest's sha256."""

    def __init__(self, root: Path, name: str, expected: str, actual: str | None, hint: str) -> None:
        self.path, self.name, self.expected, self.actual = root / name, name, expected, actual
        if actual is None:
            problem = f"{name} is listed in the manifest (sha256 {expected[:SHORT]}) but missing"
        else:
            problem = (
                f"{name} is corrupted: sha256 {actual[:SHORT]}, manifest expects {expected[:SHORT]}"
            )
        super().__init__(f"{problem} (export root {root}); {hint}")


@dataclass
class Verification:
    """What one check covered: files and bytes hashed (or remembered) and how long it took."""

    version: int
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    unverified: bool = False  # no sha256 table: loaded as is (see the module docstring)
    unlisted: list[str] = field(default_factory=list)


_memory: dict[str, tuple[tuple[int, ...], str]] = {}
_memory_lock = threading.Lock()


def _identity(stat: os.stat_result) -> tuple[int, ...]:
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def file_sha256(path: Path) -> str:
    """The file's sha256, read in chunks; remembered while the file is unchanged."""
    key = str(path.absolute())
    identity = _identity(path.stat())
    with _memory_lock:
        known = _memory.get(key)
    if known is not None and known[0] == identity:
        return known[1]
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    with path.open("rb") as handle:
        while size := handle.readinto(buffer):
            digest.update(view[:size])
    value = digest.hexdigest()
    if _identity(path.stat()) == identity:  # not written while it was read
        with _memory_lock:
            _memory[key] = (identity, value)
    return value


def manifest_files(root: Path, version: int) -> dict[str, str] | None:
    """The sha256 table of ``releases/<version>/manifest.json``; None when it has none.

    Raises ``ArtifactError`` when the manifest is missing or not valid JSON.
    """
    path = root / "releases" / str(version) / MANIFEST
    if not path.is_file():
        raise ArtifactError(f"{path} is missing (incomplete export)")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ArtifactError(f"{path}: not valid JSON ({error}); re-export this version") from None
    files = manifest.get("files")
    return {str(k): str(v) for k, v in files.items()} if isinstance(files, dict) else None


def _listed(root: Path, directory: str) -> set[str]:
    base = root / directory
    if not base.is_dir():
        return set()
    return {
        str(p.relative_to(root))
        for p in base.rglob("*")
        if p.is_file() and not IGNORED_DIRECTORIES & set(p.relative_to(base).parts)
    }


def verify_version(
    root: Path, version: int, directories: Iterable[str] | None = None, hint: str = ""
) -> Verification:
    """Check the files of ``version`` under ``directories`` (paths relative to ``root``,
    e.g. ``releases/3``; default: every file the manifest lists) against its manifest.

    Raises ``ArtifactVerificationError`` naming the first bad file (and counting the others);
    ``hint`` is appended to the message (what the caller's user can do about it).
    """
    started = time.perf_counter()
    result = Verification(version)
    table = manifest_files(root, version)
    if table is None:
        log.warning(
            "%s has no sha256 table: version %d is loaded UNVERIFIED (re-export it to verify)",
            root / "releases" / str(version) / MANIFEST,
            version,
        )
        result.unverified = True
        return result
    prefixes = None if directories is None else [d.rstrip("/") + "/" for d in directories]
    wanted = sorted(n for n in table if prefixes is None or n.startswith(tuple(prefixes)))
    for prefix in prefixes or []:
        own = {f"releases/{version}/{MANIFEST}"}
        result.unlisted += sorted(_listed(root, prefix) - set(table) - own)
    if result.unlisted:
        log.warning(
            "version %d: files not in its manifest are ignored: %s",
            version,
            ", ".join(result.unlisted[:5]) + (" ..." if len(result.unlisted) > 5 else ""),
        )

    def check(name: str) -> tuple[str, int, str | None]:
        path = root / name
        if not path.is_file():
            return name, 0, None
        return name, path.stat().st_size, file_sha256(path)

    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        checked = list(pool.map(check, wanted))
    bad = [(name, actual) for name, _, actual in checked if actual != table[name]]
    if bad:
        name, actual = bad[0]
        others = f" ({len(bad) - 1} more bad file(s): {', '.join(n for n, _ in bad[1:4])})"
        what = hint or "re-copy the version from the export store or re-export it"
        raise ArtifactVerificationError(
            root, name, table[name], actual, what + (others if len(bad) > 1 else "")
        )
    result.files = len(checked)
    result.bytes = sum(size for _, size, _ in checked)
    result.seconds = time.perf_counter() - started
    log.info(
        "version %d: %d files (%.1f MB) match the manifest's sha256 (%.2f s)",
        version,
        result.files,
        result.bytes / 1e6,
        result.seconds,
    )
    return result


def verify_model_directory(directory: Path, hint: str = "") -> Verification:
    """Check ``<root>/model_repository/<model>/<version>/`` against its release's manifest.

    The release manifest sits at ``<root>/releases/<version>/manifest.json``; a model
    directory with none there (a repository copied away from its releases) is loaded
    unverified, with a warning.
    """
    directory = directory.absolute()
    if not directory.name.isdigit():
        raise ArtifactError(f"{directory}: a model version directory is named by its version")
    version = int(directory.name)
    root = directory.parents[2]
    if not (root / "releases" / str(version) / MANIFEST).is_file():
        log.warning(
            "%s: no release manifest at %s; the model is loaded UNVERIFIED",
            directory,
            root / "releases" / str(version) / MANIFEST,
        )
        return Verification(version, unverified=True)
    return verify_version(root, version, [str(directory.relative_to(root))], hint)
