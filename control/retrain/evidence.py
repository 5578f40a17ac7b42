"""Which logged feedback a retrain may learn from, and how much of it.

The gateway stores every event with the trust level it vouched for
(``services.events.attribution``): ``served`` events (about an answer it logged, of the same
user, for an item shown) train as served rows; ``organic`` events (no answer named) are a
legitimate source, but bounded: no user and no item may weigh more than its cap of the organic
rows, so one client, user or item cannot dominate a retrain or the gate's holdout; untrusted
events never become rows. ``imported`` events (written by the operator's own tools, e.g. a
replay) count as the base data does. Events logged before trust levels existed are vouched for
here, by the same rules, against the impression snapshots. The rules run over every snapshot at
every retrain, so a forged event never persists into a later one."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd

from control.retrain.dataset import TrainingData, logged_interactions
from control.validation.config import LoggedEvents
from control.validation.verdict import Check
from services.events.attribution import IMPORTED, ORGANIC, SERVED

LEGACY_SOURCE = "legacy"  # events stored before the gateway recorded a source


@dataclass(frozen=True)
class OrganicCaps:
    """One user's (or item's) organic rows are capped at ``max(min_cap, share x organic
    rows)``; the rows kept are the earliest (a flood comes after the genuine history)."""

    user_share: float
    item_share: float
    min_cap: int


def vouched_feedback(
    feedback: pd.DataFrame, impressions: pd.DataFrame
) -> tuple[pd.DataFrame, Counter]:
    """The served and organic events of ``feedback`` (with ``trust`` and ``source``
    columns), and the others counted by reason (``untrusted_<reason>``)."""
    feedback = feedback.copy()
    for column in ("trust", "source"):
        if column not in feedback:
            feedback[column] = ""
        feedback[column] = feedback[column].fillna("").astype(str)
    legacy = feedback["trust"] == ""
    if legacy.any():
        feedback.loc[legacy, "trust"] = _vouch_from_log(feedback[legacy], impressions)
        feedback.loc[legacy & (feedback["source"] == ""), "source"] = LEGACY_SOURCE
    kept = feedback["trust"].isin([SERVED, ORGANIC, IMPORTED])
    dropped = Counter(f"untrusted_{t}" for t in feedback.loc[~kept, "trust"])
    return feedback[kept].reset_index(drop=True), dropped


def _vouch_from_log(events: pd.DataFrame, impressions: pd.DataFrame) -> np.ndarray:
    """Trust levels of events stored without one, from the logged answers (the rules of
    ``services.events.attribution.vouch``)."""
    trust = np.full(len(events), ORGANIC, dtype=object)
    named = (events["request_id"] != "").to_numpy()
    if not named.any():
        return trust
    answers = impressions[["request_id", "user_id", "items"]].drop_duplicates("request_id")
    joined = events[["request_id", "user_id", "item_id"]].merge(
        answers, on="request_id", how="left", suffixes=("", "_answer")
    )
    logged = joined["user_id_answer"].notna().to_numpy()
    same_user = logged & (joined["user_id"] == joined["user_id_answer"]).to_numpy()
    shown = np.array(
        [
            same and item in items
            for same, item, items in zip(same_user, joined["item_id"], joined["items"], strict=True)
        ],
        dtype=bool,
    )
    trust[named & ~logged] = "unknown_request"
    trust[named & logged & ~same_user] = "user_mismatch"
    trust[named & same_user & ~shown] = "item_not_shown"
    trust[named & shown] = SERVED
    return trust


def bound_organic(rows: pd.DataFrame, caps: OrganicCaps) -> tuple[pd.DataFrame, Counter, list[str]]:
    """``rows`` (``logged_interactions``' output) with each user's and each item's organic
    rows cut to their cap, what was cut (``capped_user``, ``capped_item``), and a note per
    user or item that was capped (for the gate's report)."""
    organic = (rows["trust"] == ORGANIC).to_numpy(bool)
    total = int(organic.sum())
    if total == 0:
        return rows, Counter(), []
    keep = np.ones(len(rows), bool)
    dropped: Counter = Counter()
    notes = []
    order = np.argsort(rows["timestamp"].to_numpy(), kind="stable")
    for column, share, name in (
        ("user_id", caps.user_share, "user"),
        ("item_id", caps.item_share, "item"),
    ):
        cap = max(caps.min_cap, int(share * total))
        candidates = order[organic[order] & keep[order]]  # in time order
        keys = rows[column].to_numpy()[candidates]
        rank = pd.Series(keys).groupby(keys).cumcount().to_numpy()
        cut = candidates[rank >= cap]
        if not len(cut):
            continue
        keep[cut] = False
        dropped[f"capped_{name}"] += len(cut)
        for key, count in rows.iloc[cut][column].value_counts().head(5).items():
            notes.append(
                f"organic events capped: {name} {key} had {count + cap} of the {total} "
                f"organic rows, {count} over its cap of {cap}"
            )
    return rows[keep].reset_index(drop=True), dropped, notes


def logged_rows(
    feedback: pd.DataFrame, impressions: pd.DataFrame, config: LoggedEvents
) -> tuple[pd.DataFrame, Counter, list[str]]:
    """The training rows of the logged streams: vouched for, organic ones capped; what was
    left out, by reason; notes on the caps for the gate's report."""
    kept, dropped = vouched_feedback(feedback, impressions)
    caps = OrganicCaps(config.organic_user_share, config.organic_item_share, config.organic_min_cap)
    rows, capped, notes = bound_organic(logged_interactions(kept, impressions), caps)
    return rows, dropped + capped, notes


def unvouched_check(data: TrainingData, config: LoggedEvents) -> Check:
    """Fails when organic events are more of the holdout than the configured share: the
    verdict would then be theirs, whoever sent them."""
    share = data.unvouched_share()
    limit = config.max_unvouched_holdout_share
    return Check(
        "holdout.unvouched_share",
        share,
        limit,
        share <= limit,
        f"{share:.0%} of the holdout is organic events no logged answer vouches for "
        f"(at most {limit:.0%}; by source: "
        + ", ".join(f"{s} {n}" for s, n in data.holdout_sources().most_common(5))
        + ")",
        kind="sanity",
    )
