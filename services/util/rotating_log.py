"""A size-bounded log file fed from a pipe: the output of a child process that writes to
stdout/stderr and has no rotation of its own (``tritonserver --log-file`` has none).

``path`` never exceeds ``max_bytes``: when a write would cross it, ``path`` becomes
``path.1`` (``path.1`` -> ``path.2`` ... up to ``backups``; the oldest is dropped).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


class RotatingLog:
    """Size-rotated files; ``pump(fd)`` copies a pipe into them on a thread until EOF."""

    def __init__(self, path: Path, max_bytes: int = 10 << 20, backups: int = 3) -> None:
        if max_bytes < 1024:
            raise ValueError(f"max_bytes must be at least 1024, got {max_bytes}")
        if backups < 0:
            raise ValueError(f"backups must be >= 0, got {backups}")
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._lock = threading.Lock()
        self._file: int | None = None
        self._size = 0

    def _open(self) -> int:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
            self._size = os.fstat(self._file).st_size
        return self._file

    def _rotate(self) -> None:
        if self._file is not None:
            os.close(self._file)
            self._file = None
        for n in range(self.backups, 0, -1):
            source = self.path.with_name(f"{self.path.name}.{n - 1}") if n > 1 else self.path
            if source.exists():
                os.replace(source, self.path.with_name(f"{self.path.name}.{n}"))
        if self.backups == 0:
            self.path.unlink(missing_ok=True)

    def write(self, data: bytes) -> None:
        """Append ``data``, rotating first when it would not fit (split when larger than a
        whole file)."""
        with self._lock:
            while data:
                fd = self._open()
                room = self.max_bytes - self._size
                if room <= 0 or (len(data) > room and self._size > 0):
                    self._rotate()
                    continue
                chunk, data = data[:room], data[room:]
                os.write(fd, chunk)
                self._size += len(chunk)

    def pump(self, fd: int) -> threading.Thread:
        """Copy the pipe ``fd`` into the log on a daemon thread; it closes ``fd`` at EOF."""

        def run() -> None:
            try:
                while chunk := os.read(fd, 65536):
                    self.write(chunk)
            finally:
                os.close(fd)

        thread = threading.Thread(target=run, daemon=True, name=f"log-pump-{self.path.name}")
        thread.start()
        return thread

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                os.close(self._file)
                self._file = None
