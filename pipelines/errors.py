"""Domain exceptions of the offline pipeline (the serving side maps them to HTTP in one place)."""

from __future__ import annotations

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
