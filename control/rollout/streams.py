"""The rollout's evidence from the logged streams: each look adds the answers and vouched
clicks logged since the last one to the two arms (production = control, candidate = canary),
from the cursors the rollout record keeps."""

from __future__ import annotations

import numpy as np

from control.rollout.state import RolloutRecord, user_cluster
from services.events.attribution import SERVED
from services.stores.base import OnlineStore

ERROR_REASONS = (":error", ":bad_scores")  # a model failed, not just a fallback taken
READ_BATCH = 10_000


async def read_arms(store: OnlineStore, record: RolloutRecord) -> None:
    """Add what was logged since the last look to the arms: answers (items shown, degraded and
    failed ones, latencies, the split that assigned them) and the clicks the gateway vouched
    for; the record's cursors move past what was read."""
    arms = {record.production: record.arm("control"), record.version: record.arm("canary")}
    names = {record.production: "control", record.version: "canary"}
    while True:
        entries = await store.read_stream("impressions", record.cursors["impressions"], READ_BATCH)
        latencies: dict[int, list[float]] = {version: [] for version in arms}
        for stream_id, fields in entries:
            record.cursors["impressions"] = stream_id
            version = _int(fields.get("model_version"))
            arm = arms.get(version)
            if arm is None:
                continue
            reasons = fields.get("reasons", "").split()
            user = fields.get("user_id", "")
            arm.add_request(user, len(fields.get("items", "").split()))
            if record.covariates is not None:
                record.covariates.see(names[version], user, user_cluster(user))
            arm.degraded += bool(reasons)
            arm.errors += any(r.endswith(ERROR_REASONS) for r in reasons)
            latencies[version].append(_float(fields.get("latency_ms")))
            share = assigning_share(fields.get("split", ""), record.version)
            if share is not None:
                record.split(share).add(fields.get("user_id", ""), canary=version == record.version)
        for version, values in latencies.items():
            arms[version].add_latencies(np.asarray(values, np.float64))
        if len(entries) < READ_BATCH:
            break
    while True:
        entries = await store.read_stream("feedback", record.cursors["feedback"], READ_BATCH)
        for stream_id, fields in entries:
            record.cursors["feedback"] = stream_id
            arm = arms.get(_int(fields.get("model_version")))
            # only clicks the gateway vouched for (services.events.attribution): an unvouched
            # click never moves a canary's CTR, whatever version it claims
            if arm is None or fields.get("type") != "click" or fields.get("trust") != SERVED:
                continue
            arm.add_click(fields.get("user_id", ""), hit=fields.get("hit") == "1")
        if len(entries) < READ_BATCH:
            break


def assigning_share(split: str, canary: int) -> str | None:
    """The canary share of an answer's ``split`` field (``"2:0.05"``, see
    ``VersionRouter.split``) when that split was this rollout's canary ``canary`` at a share
    that tells the arms apart; None otherwise (requested by the client, no canary yet on that
    replica, another canary, a share of 0 or 1, malformed, or a gateway too old to log it)."""
    version, _, share = split.partition(":")
    try:
        weight = float(share)
    except ValueError:
        return None
    if _int(version) != canary or not 0.0 < weight < 1.0:
        return None
    return f"{weight:g}"


def _int(value: str | None) -> int:
    """A stream field as an int; -1 (no arm) when missing or malformed."""
    try:
        return int(value) if value else -1
    except ValueError:
        return -1


def _float(value: str | None) -> float:
    try:
        return float(value) if value else 0.0
    except ValueError:
        return 0.0
