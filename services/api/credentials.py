"""Bearer credentials of the endpoints that change state or feed training.

Keys come from the settings (a secret value, or a mounted file read again when it changes,
so a rotated secret applies without a restart) and are compared in constant time. A key is
never logged; a client is known by the key's fingerprint (a short hash of it).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from fastapi import HTTPException
from fastapi.security import HTTPBearer
from pydantic import SecretStr

from services.settings import FeedbackSettings

bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <key>")


def fingerprint(key: str) -> str:
    """A name for the client holding ``key`` that reveals nothing of it."""
    return "key:" + hashlib.sha256(key.encode()).hexdigest()[:12]


def read_key_file(path: Path) -> list[str]:
    """One key per line (blank lines and surrounding whitespace ignored); a file that
    cannot be read is a 503 naming it (the caller may retry once it is mounted)."""
    try:
        text = path.read_text()
    except OSError as error:
        raise HTTPException(503, f"the key file {path} cannot be read ({error.strerror})") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


class KeyRing:
    """The accepted keys: configured values plus a key file's lines (two keys at once while
    a rotation is under way)."""

    def __init__(self, keys: list[SecretStr], key_file: Path | None) -> None:
        self.keys = [k.get_secret_value() for k in keys if k.get_secret_value()]
        self.key_file = key_file
        self._file_keys: list[str] = []
        self._file_stamp: tuple[float, int] | None = None

    def current(self) -> list[str]:
        if self.key_file is None:
            return self.keys
        try:
            stat = self.key_file.stat()
            stamp = (stat.st_mtime, stat.st_size)
        except OSError:
            stamp = None
        if stamp is None or stamp != self._file_stamp:
            self._file_keys = read_key_file(self.key_file)
            self._file_stamp = stamp
        return [*self.keys, *self._file_keys]

    @property
    def configured(self) -> bool:
        return bool(self.keys) or self.key_file is not None

    def match(self, presented: str) -> str | None:
        """The key ``presented`` equals, compared with every key in constant time."""
        found = None
        for key in self.current():
            if hmac.compare_digest(presented.encode(), key.encode()):
                found = key
        return found


def feedback_auth(settings: FeedbackSettings) -> str:
    """How POST /v1/feedback authenticates: ``keys``, ``open`` (no key needed: said loudly)
    or ``off`` (no key configured: every event is refused)."""
    if settings.open:
        return "open"
    if settings.keys or settings.keys_file is not None:
        return "keys"
    return "off"


def ensure_key_file(path: Path) -> bool:
    """Write a new random key to ``path`` (owner-only) unless a file is there; True when
    it wrote one. The embedded stack's default, so that feedback is never open by default."""
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process wrote it first: use theirs
        return False
    with os.fdopen(descriptor, "w") as handle:
        handle.write(secrets.token_urlsafe(32) + "\n")
    return True
