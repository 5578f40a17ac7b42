"""Per-request model version selection: explicit request, canary split, or the default."""

from __future__ import annotations

import zlib

from core.ids import ExternalId


class VersionRouter:
    """Routes a stable share of users to a canary version; the rest to the default.

    A user's bucket is ``crc32(salt/user_id) mod 10000`` (the data set's id, as sent): stable
    for one ``salt``, so raising the weight keeps the users already on the canary there; each
    rollout passes its own salt so the canary's users are drawn afresh (otherwise every
    rollout would test on the same users, and a fixed difference between two user groups
    would look like a model effect).
    """

    def __init__(
        self,
        default: int,
        canary: int | None = None,
        canary_percent: float = 0.0,
        salt: str = "",
    ) -> None:
        self.default = default
        self.canary = canary
        self.canary_percent = canary_percent
        self.salt = salt

    @property
    def versions(self) -> list[int]:
        return sorted({self.default, *([self.canary] if self.canary is not None else [])})

    @property
    def split(self) -> str:
        """The canary split this router assigns users by, as ``canary:share`` (``2:0.05``), or
        ``""`` without one. Logged with every answer it assigned, so that a rollout's
        sample-ratio test compares each answer's arm with the share that actually assigned it
        (a replica still loading the canary assigns everyone to production, and says so)."""
        if self.canary is None or self.canary_percent <= 0:
            return ""
        return f"{self.canary}:{self.canary_percent / 100:g}"

    def assign(self, user_id: ExternalId, requested: int | None = None) -> tuple[int, str]:
        """(version, split): ``requested`` when it is a served version (split ``""``: the
        client chose, not the split); else the user's stable bucket decides."""
        if requested is not None and requested in self.versions:
            return requested, ""
        if self.canary is not None and self.canary_percent > 0:
            bucket = zlib.crc32(f"{self.salt}/{user_id}".encode()) % 10_000 / 100.0
            if bucket < self.canary_percent:
                return self.canary, self.split
        return self.default, self.split

    def route(self, user_id: ExternalId, requested: int | None = None) -> int:
        """The version of ``assign``."""
        return self.assign(user_id, requested)[0]
