"""Filtering stage: drop seen, unavailable, request-excluded and rule-excluded items and
duplicates; fill from popularity when fewer than k remain. Vectorised over the arrays."""

from __future__ import annotations

import numpy as np

from services.serving.context import RequestContext
from services.serving.release import Release
from services.serving.rules import Rules


def rule_excluded_ids(rules: Rules, release: Release, ctx: RequestContext) -> np.ndarray:
    """Catalog positions the rules exclude for this user."""
    banned: list[np.ndarray] = []
    age_text = ctx.user.attributes.get("age") if ctx.user is not None else None
    age = float(age_text) if age_text not in (None, "", "None", "nan") else None
    for rule in rules.exclude:
        if rule.max_user_age is not None and (age is None or age > rule.max_user_age):
            continue  # an unknown age is not assumed to be a minor's
        if rule.item_ids:
            banned.append(release.positions(np.asarray(rule.item_ids, dtype=np.int64)))
        if rule.genres:
            hit = np.zeros(len(release.genres), dtype=bool)
            for genre in rule.genres:
                hit |= (
                    np.char.find(np.char.add(np.char.add("|", release.genres), "|"), f"|{genre}|")
                    >= 0
                )
            banned.append(np.flatnonzero(hit))
    return np.concatenate(banned) if banned else np.zeros(0, np.int64)


class FilteringStage:
    name = "filtering"

    def __init__(self, releases: dict[int, Release]) -> None:
        self.releases = releases  # each with its rules (``Release.rules``)

    def banned_positions(self, release: Release, ctx: RequestContext) -> np.ndarray:
        seen = ctx.user.seen if ctx.user is not None else np.zeros(0, np.int64)
        raw = np.concatenate([seen, ctx.unavailable, ctx.exclude]).astype(np.int64)
        positions = release.positions(raw)
        return np.unique(
            np.concatenate(
                [
                    positions[positions >= 0],
                    release.unavailable,
                    rule_excluded_ids(release.rules, release, ctx),
                ]
            )
        )

    async def __call__(self, ctx: RequestContext) -> RequestContext:
        release = self.releases[ctx.model_version]
        banned = self.banned_positions(release, ctx)
        ctx.banned = banned  # ordering must not pin a banned item back in
        keep = ~np.isin(ctx.candidates, banned)
        _, first = np.unique(ctx.candidates, return_index=True)
        unique = np.zeros(len(ctx.candidates), dtype=bool)
        unique[first] = True
        keep &= unique
        ctx.candidates, ctx.retrieval_scores = ctx.candidates[keep], ctx.retrieval_scores[keep]
        missing = ctx.k - len(ctx.candidates)
        if missing > 0:
            extra = release.popularity[
                ~np.isin(release.popularity, np.concatenate([banned, ctx.candidates]))
            ][:missing]
            if len(extra):
                floor = float(ctx.retrieval_scores.min()) if len(ctx.retrieval_scores) else 0.0
                scores = floor - 1.0 - np.arange(len(extra), dtype=np.float32) / len(extra)
                ctx.candidates = np.concatenate([ctx.candidates, extra])
                ctx.retrieval_scores = np.concatenate(
                    [ctx.retrieval_scores, scores.astype(np.float32)]
                )
                ctx.degrade(self.name, "too_few_candidates")
        return ctx
