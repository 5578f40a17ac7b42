"""Replay held-back interactions as logged traffic (tests, the benchmark, demos).

The newest part of a data set (what ``oldest`` held back from the base) is written into the
feedback and impression streams: per interaction one impression set of ``k`` items, the
rated item first and popular items after it; a click when the rating is >= 4, an
``impression`` event (shown, not clicked) when it is <= 2, nothing for a 3 (neutral, as the
ranking protocol drops it). Event times are the interactions' own, so the replayed traffic
is newer than the base. Its events are the users' own choices, not answers of a served
model (which would favour that model in the gate), so they carry no ``request_id``, and the
operator wrote them (trust ``imported``, source ``replay``): the retrain judges them like the
base data (rows of served answers are retrieval positives
only, see ``control.retrain.dataset``), and skip-above derives nothing from the filler.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines.data.schema import RawDataset
from services.events.attribution import IMPORTED
from services.stores.base import OnlineStore

BATCH = 1000
REPLAY_SOURCE = "replay"


def replay_records(
    dataset: RawDataset, fraction: float, k: int = 10, seed: int = 0, model_version: int = 1
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(feedback events, impression records) of the newest ``1 - fraction`` interactions."""
    rng = np.random.default_rng(seed)
    frame = dataset.interactions
    order = np.argsort(frame["timestamp"].to_numpy(), kind="stable")
    future: pd.DataFrame = frame.iloc[order[round(fraction * len(order)) :]]
    popular = frame["item_id"].value_counts().index.to_numpy()[: max(50, 5 * k)]
    feedback, impressions = [], []
    for number, (user, item, rating, ts) in enumerate(
        future[["user_id", "item_id", "rating", "timestamp"]].itertuples(index=False)
    ):
        request_id = f"replay-{seed}-{number}"
        others = rng.choice(popular[popular != item], k - 1, replace=False)
        items = np.insert(others, 0, item)
        impressions.append(
            {
                "request_id": request_id,
                "user_id": str(int(user)),
                "model_version": str(model_version),
                "items": " ".join(str(int(i)) for i in items),
                "scores": " ".join(f"{s:.3f}" for s in np.linspace(1, 0, k)),
                "degraded": "0",
                "timestamp": str(int(ts)),
            }
        )
        if rating == 3:
            continue
        feedback.append(
            {
                "user_id": str(int(user)),
                "item_id": str(int(item)),
                "type": "click" if rating >= 4 else "impression",
                "model_version": str(model_version),
                "timestamp": str(int(ts)),
                "event_id": f"{request_id}-{int(item)}",
                "trust": IMPORTED,
                "source": REPLAY_SOURCE,
            }
        )
    return feedback, impressions


async def write_records(
    store: OnlineStore, feedback: list[dict[str, str]], impressions: list[dict[str, str]]
) -> None:
    """Append both lists to the store's streams, in batches (the store must be started)."""
    for start in range(0, len(impressions), BATCH):
        await store.append_impressions(impressions[start : start + BATCH], 10_000_000, 86_400)
    for start in range(0, len(feedback), BATCH):
        await store.append_feedback(feedback[start : start + BATCH], 10_000_000, 86_400)
