"""Domain exceptions of the offline pipeline (the serving side maps them to HTTP in one place)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path


class CascadeError(Exception):
    """Base class of every error Cascade raises on purpose."""


class DataError(CascadeError):
    """Input data is missing or malformed; the message names the file and line."""

    def __init__(self, path: Path | str, message: str, line: int | None = None) -> None:
        self.path = str(path)
        self.line = line
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")


class ArtifactError(CascadeError):
    """An exported artifact is missing, inconsistent, or would overwrite an existing version."""


class ConfigError(CascadeError):
    """An option is out of range or inconsistent with another one."""


class UsageError(ConfigError):
    """Command-line options that exclude or need each other: a usage error (exit code 2),
    raised before the command does anything."""


class WriteError(OSError):
    """Writing ``filename`` failed (the file meant, not the temporary one written first);
    still an OSError, so whoever handles those handles it too."""


@contextlib.contextmanager
def writing(path: Path | str) -> Iterator[None]:
    """An OSError inside becomes a ``WriteError`` naming ``path``."""
    try:
        yield
    except WriteError:
        raise
    except OSError as error:
        raise WriteError(error.errno, error.strerror or str(error), str(path)) from error
