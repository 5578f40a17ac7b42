"""The size-bounded log a child's output is piped into."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.util.rotating_log import RotatingLog


def _files(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}*"))


def test_no_file_exceeds_the_bound_and_old_files_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    log = RotatingLog(path, max_bytes=1024, backups=2)
    lines = [f"line {i:05d} ".encode() + b"x" * 80 + b"\n" for i in range(200)]
    for line in lines:
        log.write(line)
    log.write(b"y" * 5000)  # one write larger than a whole file
    log.close()
    files = _files(path)
    assert [f.name for f in files] == ["server.log", "server.log.1", "server.log.2"]
    assert all(f.stat().st_size <= 1024 for f in files)
    assert b"line 00000" not in b"".join(f.read_bytes() for f in files)  # rotated away


def test_lines_are_not_split_across_files_when_they_fit(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    log = RotatingLog(path, max_bytes=1024, backups=5)
    for i in range(50):
        log.write(f"{i:03d} ".encode() + b"z" * 95 + b"\n")
    log.close()
    for f in _files(path):
        assert all(len(line) == 100 for line in f.read_bytes().splitlines(keepends=True))


def test_a_pipe_is_copied_until_eof(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    log = RotatingLog(path, max_bytes=4096, backups=0)
    read_end, write_end = os.pipe()
    thread = log.pump(read_end)
    os.write(write_end, b"hello\n" * 1000)  # 6000 bytes: rotates once, nothing kept
    os.close(write_end)
    thread.join(timeout=10)
    log.close()
    assert not thread.is_alive()
    assert _files(path) == [path] and path.stat().st_size <= 4096


def test_bad_bounds_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        RotatingLog(tmp_path / "a.log", max_bytes=10)
    with pytest.raises(ValueError, match="backups"):
        RotatingLog(tmp_path / "a.log", backups=-1)
