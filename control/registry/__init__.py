"""The version registry: the one place that says each exported version's state.

Transitions (anything else raises ``RegistryError`` naming the version and both states)::

    register, verdict "pass" or forced ..... (new) -> candidate
    register, verdict "fail" ............... (new) -> rejected
    register again, another verdict ........ candidate <-> rejected (the gate ran again / --force)
    candidate ............................... -> canary | production | retired
    canary .................................. -> production | retired (rolled back)
    production .............................. -> retired, only by promoting another version:
                                                 the old production becomes previous_production
    retired ................................. -> production, only the previous production
                                                 (instant rollback)
    rejected ................................ -> retired

A transition to the state a version is already in is a no-op (steps are safe to run twice);
at most one version is canary at a time. A rejected version reaches canary only by being
registered again with a forced verdict (it becomes a candidate, and the audit log says why).

Storage, one JSON document per registry (records, production, previous production):
``RedisRegistry`` keeps it in ``{ns}:registry:state`` (changed in WATCH/MULTI transactions,
so every gateway replica and job sees one order of changes), the audit log in the stream
``{ns}:registry:audit`` and each lock in ``{ns}:registry:lock:{name}`` (expiring in Redis).
``FileRegistry`` keeps it in ``<artifacts>/registry.json`` (changed under an ``fcntl`` lock,
replaced atomically), the audit log in ``registry.audit.jsonl`` beside it, and its locks in
the document (a lock expires after its ttl, or as soon as its holder's pid on this host is dead).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from control.registry.base import Registry
from control.registry.file_registry import FileRegistry
from control.registry.lock import Lock
from control.registry.records import (
    HOLDER,
    LockHeld,
    LockLost,
    RegistryError,
    RegistryUnavailable,
    VersionRecord,
    VersionState,
)
from control.registry.redis_registry import RedisRegistry
from core.export.repository import complete_versions

if TYPE_CHECKING:
    from services.settings import Settings

__all__ = [
    "HOLDER",
    "FileRegistry",
    "Lock",
    "LockHeld",
    "LockLost",
    "RedisRegistry",
    "Registry",
    "RegistryError",
    "RegistryUnavailable",
    "VersionRecord",
    "VersionState",
    "adopt_served",
    "make_registry",
]


def make_registry(settings: Settings) -> Registry:
    """Redis when the settings name one (shared by every replica), else the file."""
    if settings.redis.durable:
        return RedisRegistry(settings.redis.durable, settings.redis.namespace)
    return FileRegistry(settings.artifacts / "registry.json")


def adopt_served(registry: Registry, artifacts: Path) -> int | None:
    """First deploy: with no production recorded, the newest complete version on disk that is
    not rejected or retired (what an unpinned gateway serves) becomes production, reason
    "adopted: first deploy". Returns the production version (None: nothing to adopt)."""
    production = registry.production()
    if production is not None:
        return production
    for version in reversed(complete_versions(artifacts)):
        record = registry.get(version)
        if record is None or record.state in (VersionState.CANDIDATE, VersionState.CANARY):
            return registry.adopt(version, "adopted: first deploy")
    return None
