"""Ordering stage: campaign boosts, per-genre diversity cap, pinned items, optional
exploration; returns the top k sorted by (final) score."""

from __future__ import annotations

import datetime as dt

import numpy as np

from services.serving.context import RequestContext
from services.serving.release import Release
from services.serving.rules import Rules


def apply_boosts(
    rules: Rules, release: Release, positions: np.ndarray, scores: np.ndarray, day: dt.date
) -> np.ndarray:
    """Scores after the boosts active on ``day``; the genre strings of the candidates are
    built only when an active boost names genres (none at all without boosts)."""
    scores = scores.astype(np.float32)  # a copy: the caller's array is left as it was
    active = [boost for boost in rules.boosts if boost.active(day)]
    if any(boost.genres for boost in active):
        genres = np.char.add(np.char.add("|", release.genres[positions]), "|")
    for boost in active:
        hit = np.isin(positions, release.positions(np.asarray(boost.item_ids, dtype=np.int64)))
        for genre in boost.genres:
            hit |= np.char.find(genres, f"|{genre}|") >= 0
        scores[hit] = scores[hit] * boost.factor + boost.add
    return scores


def diversity_order(genres: np.ndarray, cap: int) -> np.ndarray:
    """A stable reordering of score-sorted items: the first ``cap`` of each genre keep their
    places, the rest move (in order) behind them."""
    _, codes = np.unique(genres, return_inverse=True)
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    group_start = np.r_[0, np.flatnonzero(sorted_codes[1:] != sorted_codes[:-1]) + 1]
    run = np.repeat(group_start, np.diff(np.r_[group_start, len(codes)]))
    occurrence = np.empty(len(codes), dtype=np.int64)
    occurrence[order] = np.arange(len(codes)) - run
    return np.r_[np.flatnonzero(occurrence < cap), np.flatnonzero(occurrence >= cap)]


class OrderingStage:
    name = "ordering"

    def __init__(self, releases: dict[int, Release], seed: int | None = None) -> None:
        self.releases = releases  # each with its rules (``Release.rules``)
        self.rng = np.random.default_rng(seed)

    async def __call__(self, ctx: RequestContext) -> RequestContext:
        release = self.releases[ctx.model_version]
        rules = release.rules
        day = dt.datetime.fromtimestamp(ctx.timestamp, tz=dt.UTC).date()
        positions = ctx.candidates
        scores = apply_boosts(rules, release, positions, ctx.scores, day)
        order = np.argsort(-scores, kind="stable")
        positions, scores = positions[order], scores[order]
        cap = rules.diversity.max_per_genre
        if cap is not None and len(positions):
            reorder = diversity_order(release.primary_genre[positions], cap)
            positions, scores = positions[reorder], scores[reorder]
        positions, scores = self._pin(release, ctx, positions, scores)
        if (
            rules.exploration.epsilon > 0
            and len(positions) > ctx.k
            and self.rng.random() < rules.exploration.epsilon
        ):
            pick = int(self.rng.integers(ctx.k, len(positions)))
            positions[[ctx.k - 1, pick]] = positions[[pick, ctx.k - 1]]
        positions, scores = positions[: ctx.k], scores[: ctx.k]
        ctx.candidates, ctx.scores = (
            positions,
            np.minimum.accumulate(scores) if len(scores) else scores,
        )
        return ctx

    def _pin(
        self, release: Release, ctx: RequestContext, positions: np.ndarray, scores: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        banned = ctx.banned
        for pin in sorted(release.rules.pinned, key=lambda p: p.position):
            where = release.positions(np.asarray([pin.item_id]))[0]
            if where < 0 or np.isin(where, banned):
                continue  # not in this catalog, or seen/unavailable/excluded for this user
            keep = positions != where
            positions, scores = positions[keep], scores[keep]
            slot = min(pin.position, len(positions))
            slot_score = scores[slot - 1] if slot > 0 else (scores[0] if len(scores) else 1.0)
            positions = np.insert(positions, slot, where)
            scores = np.insert(scores, slot, slot_score)
        return positions, scores
