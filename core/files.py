"""Writing files safely: a directory checked writable before long work, JSON replaced
atomically (a reader sees the old file or the new one, never half of one)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from core.errors import WriteError, writing


def writable_dir(path: Path) -> Path:
    """Create ``path`` (and its parents) and check a file can be written in it, before a
    command spends minutes on work it could not save; raises ``WriteError`` naming it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # names the parent that is not a directory, if that is it
        raise WriteError(error.errno, error.strerror, error.filename or str(path)) from None
    with writing(path):  # read-only file system, no permission, disk full
        descriptor, probe = tempfile.mkstemp(dir=path, prefix=".cascade-write-check-")
        os.close(descriptor)
        os.unlink(probe)
    return path


def write_json(path: Path, value: Any) -> None:
    """Write JSON atomically (temporary file, fsync, rename); fails naming ``path``."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with temporary.open("w") as out:
            json.dump(value, out, indent=2, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
