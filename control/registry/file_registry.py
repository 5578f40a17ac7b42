"""The registry in a file beside the artifacts: changed under an fcntl lock, replaced
atomically; locks in the document."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from control.registry.base import Registry
from control.registry.lock import held_message, pid_alive
from control.registry.records import (
    HOLDER,
    Change,
    LockHeld,
    State,
    T,
)


class FileRegistry(Registry):
    """The registry in a JSON file beside the export (the embedded stack, without Redis)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.audit_path = self.path.with_name(f"{self.path.stem}.audit.jsonl")
        self.lock_path = self.path.with_name(f"{self.path.name}.lock")

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.lock_path.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _read(self) -> State:
        try:
            raw = self.path.read_text()
        except FileNotFoundError:
            return State()
        return State.parse(raw, str(self.path))

    def _mutate(self, change: Change[T]) -> T:
        with self._exclusive():
            state = self._read()
            before = state.dump()
            result, entries = change(state)
            if state.dump() != before:
                temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
                with temporary.open("w") as handle:
                    handle.write(state.dump())
                    handle.flush()
                    os.fsync(handle.fileno())
                temporary.replace(self.path)
            if entries:
                with self.audit_path.open("a") as handle:
                    handle.writelines(json.dumps(e) + "\n" for e in entries)
                    handle.flush()
                    os.fsync(handle.fileno())
        return result

    def audit(self, count: int = 100) -> list[dict[str, Any]]:
        try:
            with self.audit_path.open() as handle:
                return [json.loads(line) for line in deque(handle, maxlen=count)]
        except FileNotFoundError:
            return []

    @staticmethod
    def _held_by_other(held: dict[str, Any] | None, token: str) -> bool:
        if held is None or held["token"] == token or held["until"] <= time.time():
            return False
        return not (held["host"] == socket.gethostname() and not pid_alive(held["pid"]))

    def _set_lock(self, name: str, token: str, ttl_s: float) -> float:
        def change(state: State) -> tuple[float, list[dict[str, Any]]]:
            held = state.locks.get(name)
            if self._held_by_other(held, token):
                assert held is not None
                raise LockHeld(held_message(name, held))
            until = time.time() + ttl_s
            state.locks[name] = {
                "token": token,
                "holder": HOLDER,
                "until": until,
                "host": socket.gethostname(),
                "pid": os.getpid(),
            }
            return until, []

        return self._mutate(change)

    _take_lock = _set_lock
    _refresh_lock = _set_lock

    def _release_lock(self, name: str, token: str) -> None:
        def change(state: State) -> tuple[None, list[dict[str, Any]]]:
            if state.locks.get(name, {}).get("token") == token:
                del state.locks[name]
            return None, []

        self._mutate(change)
