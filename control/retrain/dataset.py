"""Logged outcomes -> training rows, appended to the base data set, and the retrain's split.

How outcomes become rows (in the raw ``rating`` schema, so the usual protocols apply:
retrieval positive = rating >= 3, ranking label = rating >= 4, rating 3 dropped):

- a click is rating 5: a retrieval positive and a ranking label 1;
- an item shown and not clicked is rating 1: a ranking label 0, never a retrieval positive.
  "Shown" is either a feedback event of type ``impression`` with no click of the same user
  and item anywhere in the log, or, from the impression log, an item ranked *above* the
  lowest click of its answer (skip-above: the user looked past it). Answers without a click
  give no negatives: nothing says the user looked at them, and they would outnumber clicks
  by k to one. Negatives are de-duplicated per (user, item), keeping the latest.
- events of users or items the base catalog does not know are dropped and counted (the
  towers and features need their attributes).

Each row also says whether it is ``served``: derived from an answer the gateway logged (an
event the gateway vouched for as ``served``, see ``control.retrain.evidence``, or a
skip-above negative), its ``trust`` level and which ``source`` (client key) sent it.
The serving models chose what such rows show, so the gate never judges them (they favour
production: see ``pipelines.split.holdout_split``); they train later candidates once older
than the holdout window. Events without one (the user's own choices, or replayed data)
are judged like the base data.

Every row keeps its event time. The split (``pipelines.split.holdout_split``): the newest
window of the rows no serving model chose, minus the rows production learnt from
(``Learnt``), is the gate's holdout; every older row is training data for the candidate.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from control.validation.holdout import Holdout
from pipelines.data.schema import INTERACTION_COLUMNS, RawDataset, oldest, oldest_rows
from pipelines.split import Split, holdout_split, judged_window
from services.events.attribution import ORGANIC, SERVED

__all__ = ["Learnt", "TrainingData", "combine", "logged_interactions", "oldest", "oldest_rows"]

BASE_SOURCE = "base data"  # rows of the base data set (the operator's own)
CLICK_RATING = 5.0
SKIP_RATING = 1.0


ANSWER_LOG = "answer_log"  # the source of skip-above negatives: the gateway's own log


def _frame(rows: pd.DataFrame, rating: float) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "user_id": rows["user_id"].to_numpy(np.int64),
            "item_id": rows["item_id"].to_numpy(np.int64),
            "rating": np.full(len(rows), rating, np.float32),
            "timestamp": rows["timestamp"].to_numpy(np.int64),
            "served": rows["served"].to_numpy(bool),
            "trust": rows["trust"].to_numpy(object),
            "source": rows["source"].to_numpy(object),
        }
    )


def logged_interactions(feedback: pd.DataFrame, impressions: pd.DataFrame) -> pd.DataFrame:
    """Rows (user_id, item_id, rating, timestamp, served, trust, source) from parsed impressions
    and the feedback ``control.retrain.evidence.vouched_feedback`` kept."""
    feedback = feedback.assign(served=(feedback["trust"] == SERVED).to_numpy(bool))
    clicks = feedback[feedback["type"] == "click"].drop_duplicates(
        ["user_id", "item_id", "request_id", "timestamp"]
    )
    clicked_pairs = clicks[["user_id", "item_id"]].drop_duplicates()

    shown = feedback[feedback["type"] == "impression"][
        ["user_id", "item_id", "timestamp", "served", "trust", "source"]
    ]

    with_click = clicks[clicks["served"]][["request_id", "item_id"]]
    sets = impressions[impressions["request_id"].isin(with_click["request_id"])]
    skipped = pd.DataFrame(columns=["user_id", "item_id", "timestamp", "served", "trust", "source"])
    if len(sets):
        exploded = sets[["request_id", "user_id", "timestamp", "items"]].explode("items")
        exploded = exploded.rename(columns={"items": "item_id"})
        exploded["item_id"] = exploded["item_id"].astype(np.int64)
        exploded["rank"] = exploded.groupby("request_id").cumcount()
        ranked = exploded.merge(
            with_click, on=["request_id", "item_id"], how="left", indicator=True
        )
        hit = ranked["_merge"] == "both"
        lowest = ranked[hit].groupby("request_id")["rank"].max()
        ranked["lowest"] = ranked["request_id"].map(lowest)
        skipped = ranked[~hit & (ranked["rank"] < ranked["lowest"])][
            ["user_id", "item_id", "timestamp"]
        ].assign(served=True, trust=SERVED, source=ANSWER_LOG)
    negatives = pd.concat([shown, skipped], ignore_index=True)
    negatives = negatives.merge(
        clicked_pairs, on=["user_id", "item_id"], how="left", indicator=True
    )
    negatives = negatives[negatives["_merge"] == "left_only"]
    negatives = negatives.sort_values("timestamp", kind="stable").drop_duplicates(
        ["user_id", "item_id"], keep="last"
    )
    rows = pd.concat(
        [
            _frame(clicks, CLICK_RATING),
            _frame(negatives, SKIP_RATING),
        ],
        ignore_index=True,
    )
    return rows.sort_values("timestamp", kind="stable").reset_index(drop=True)


@dataclass(frozen=True)
class Learnt:
    """What production learnt from: the base rows of its reconstructed split (``base_rows``,
    one flag per base row), else every row up to ``until``; neither: nothing (first deploy).
    ``source`` says which, for the verdict."""

    base_rows: np.ndarray | None = None
    until: int | None = None
    source: str = "no production version"

    def mask(self, n_base: int, timestamps: np.ndarray) -> np.ndarray:
        """One flag per combined row (the base rows first, then the logged rows)."""
        if self.base_rows is not None:
            if len(self.base_rows) != n_base:
                raise ValueError("the learnt flags do not match the base rows")
            return np.r_[self.base_rows, np.zeros(len(timestamps) - n_base, bool)]
        if self.until is not None:
            return np.asarray(timestamps) <= self.until
        return np.zeros(len(timestamps), bool)


@dataclass
class TrainingData:
    """The combined data set, its split, and where its rows came from."""

    dataset: RawDataset
    split: Split
    base_rows: int
    logged_rows: int
    dropped: Counter
    data_hash: str
    learnt: Learnt = field(default_factory=Learnt)
    window_rows: int = 0  # the judged window, with the rows production learnt
    learnt_in_window: int = 0
    sources: np.ndarray | None = None  # per combined row: BASE_SOURCE or the client's source
    unvouched: np.ndarray | None = None  # per combined row: an organic event (no one vouches)

    def holdout_sources(self) -> Counter:
        """Rows of the judged holdout per source (the base data set, or a client)."""
        if self.sources is None:
            return Counter({BASE_SOURCE: len(self.split.test)})
        return Counter(self.sources[self.split.test].tolist())

    def unvouched_share(self) -> float:
        """The share of the holdout no one vouches for: logged organic events (the base
        data set and imported events are the operator's own; served rows are never
        judged)."""
        test = self.split.test
        if self.unvouched is None or not len(test):
            return 0.0
        return float(self.unvouched[test].mean())

    def holdout_notes(self) -> list[str]:
        """What the holdout is made of (for the verdict)."""
        test = self.split.test
        logged = int((test >= self.base_rows).sum())
        learnt = (
            f", minus the {self.learnt_in_window} production learnt from, which train the candidate"
            if self.learnt_in_window
            else ""
        )
        by_source = ", ".join(
            f"{source} {count} ({count / max(1, len(test)):.0%})"
            for source, count in self.holdout_sources().most_common()
        )
        notes = [
            f"holdout: the newest {self.window_rows} rows no serving model chose{learnt}: "
            f"{len(test)} rows, {len(test) - logged} of the base data and {logged} logged "
            f"(what production learnt: {self.learnt.source})",
            f"holdout by source: {by_source or 'none'}",
        ]
        used = len(self.split.train) + len(self.split.valid) + len(test)
        if len(self.dataset.interactions) > used:
            notes.append(
                f"{len(self.dataset.interactions) - used} rows of served answers in the same "
                "period are neither judged nor trained on: production chose what they show, "
                "so they favour it"
            )
        return notes

    def holdout(self) -> Holdout:
        """The judged holdout (the split's test part) and everything the candidate learnt
        from."""
        rows = self.dataset.interactions
        before = np.sort(np.concatenate([self.split.train, self.split.valid]))
        return Holdout(
            self.dataset.users,
            self.dataset.items,
            rows.iloc[before].reset_index(drop=True),
            rows.iloc[self.split.test].reset_index(drop=True),
        )

    def learnt_until(self) -> int:
        """Newest timestamp of the rows models learn from (train + valid): recorded in the
        manifest, so the next gate leaves older holdout rows out of the comparison."""
        rows = self.dataset.interactions["timestamp"].to_numpy()
        used = np.concatenate([self.split.train, self.split.valid])
        return int(rows[used].max()) if len(used) else 0


def combine(
    base: RawDataset,
    logged: pd.DataFrame,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    learnt: Learnt | None = None,
    seed: int = 0,
) -> TrainingData:
    """Append the logged rows the catalog knows to the base interactions and split them
    (``holdout_split``: the newest window minus what production ``learnt`` is the holdout)."""
    learnt = learnt or Learnt()
    dropped: Counter = Counter()
    known_user = logged["user_id"].isin(base.users["user_id"])
    known_item = logged["item_id"].isin(base.items["item_id"])
    dropped["unknown_user"] = int((~known_user).sum())
    dropped["unknown_item"] = int((known_user & ~known_item).sum())
    kept = logged[known_user & known_item]
    served = np.r_[
        np.zeros(len(base.interactions), bool),
        kept["served"].to_numpy(bool) if "served" in kept else np.zeros(len(kept), bool),
    ]
    interactions = pd.concat(
        [base.interactions[list(INTERACTION_COLUMNS)], kept[list(INTERACTION_COLUMNS)]],
        ignore_index=True,
    )
    if "weight" in base.interactions:  # the base's event weights; a logged row weighs 1
        interactions["weight"] = np.r_[
            base.interactions["weight"].to_numpy(np.float32), np.ones(len(kept), np.float32)
        ]
    logged_sources = kept["source"] if "source" in kept else pd.Series("", index=kept.index)
    sources = np.r_[
        np.full(len(base.interactions), BASE_SOURCE, dtype=object),
        logged_sources.fillna("").replace("", "unknown").to_numpy(object),
    ]
    n_base = len(base.interactions)
    organic = (kept["trust"] == ORGANIC).to_numpy(bool) if "trust" in kept else ~served[n_base:]
    unvouched = np.r_[np.zeros(n_base, bool), organic]
    digest = hashlib.sha256(base.content_hash().encode())
    for column in INTERACTION_COLUMNS:
        digest.update(np.ascontiguousarray(kept[column].to_numpy()).tobytes())
    combined = RawDataset(
        f"{base.name}+logs",
        base.users,
        base.items,
        interactions,
        schema=base.schema,
        user_ids=base.user_ids,
        item_ids=base.item_ids,
    )
    timestamps = interactions["timestamp"].to_numpy()
    mask = learnt.mask(len(base.interactions), timestamps)
    digest.update(np.packbits(mask).tobytes())
    split = holdout_split(timestamps, mask, served, fractions, seed, keys=interactions)
    window = judged_window(timestamps, served, fractions)
    return TrainingData(
        dataset=combined,
        split=split,
        base_rows=len(base.interactions),
        logged_rows=len(kept),
        dropped=+dropped,
        data_hash=digest.hexdigest()[:16],
        learnt=learnt,
        window_rows=len(window),
        learnt_in_window=int(mask[window].sum()),
        sources=sources,
        unvouched=unvouched,
    )
