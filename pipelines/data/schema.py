"""The one raw schema every dataset source produces.

Three tables, as pandas DataFrames, with internal integer ids (``core/ids.py`` maps a data
set's own ids to them):

- users: ``user_id`` (int64) and one column per declared user feature (``schema.user``);
- items: ``item_id`` (int64) and one column per declared item feature (``schema.item``);
  multi-categorical values as one string joined by the feature's ``separator``;
- interactions: ``user_id`` (int64), ``item_id`` (int64), ``rating`` (float32: 5 a positive,
  3 a retrieval-only positive, 1 a negative, or MovieLens's own 1-5 stars), ``timestamp``
  (int64, unix seconds), optionally ``weight`` (float32, 1 when absent).

MovieLens-100K's tables (``MOVIELENS`` features: age, gender, occupation, zip code; year,
genres) also carry ``title``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from core.features.schema import MOVIELENS, FeatureSchema
from core.ids import IdMap

INTERACTION_COLUMNS = ("user_id", "item_id", "rating", "timestamp")
GENRE_SEPARATOR = "|"


@dataclass(frozen=True)
class LatentTruth:
    """A generated dataset's hidden preferences: affinity(u, i) = user[u] . item[i] / sqrt(d),
    rows indexed by id - 1. Known only to the generator and the traffic simulator."""

    user_factors: np.ndarray
    item_factors: np.ndarray

    def affinity(self, user_ids: np.ndarray, item_ids: np.ndarray) -> np.ndarray:
        """Affinity of each (user, item) pair; ids outside the tables get 0."""
        users = np.asarray(user_ids, np.int64) - 1
        items = np.asarray(item_ids, np.int64) - 1
        known = (users >= 0) & (users < len(self.user_factors))
        known &= (items >= 0) & (items < len(self.item_factors))
        out = np.zeros(np.broadcast(users, items).shape, np.float32)
        u, i = np.broadcast_arrays(users, items)
        dim = self.user_factors.shape[1]
        out[known] = np.einsum(
            "ij,ij->i", self.user_factors[u[known]], self.item_factors[i[known]]
        ) / np.sqrt(dim)
        return out


@dataclass(frozen=True)
class RawDataset:
    """Users, items and their interactions, in the schema above."""

    name: str
    users: pd.DataFrame
    items: pd.DataFrame
    interactions: pd.DataFrame
    truth: LatentTruth | None = field(default=None, compare=False, repr=False)
    schema: FeatureSchema = field(default=MOVIELENS, compare=False)
    user_ids: IdMap = field(default_factory=IdMap.identity, compare=False, repr=False)
    item_ids: IdMap = field(default_factory=IdMap.identity, compare=False, repr=False)

    def __post_init__(self) -> None:
        for table, columns in (
            (self.users, ("user_id", *self.schema.user_attributes)),
            (self.items, ("item_id", *self.schema.item_attributes)),
            (self.interactions, INTERACTION_COLUMNS),
        ):
            missing = [c for c in columns if c not in table.columns]
            if missing:
                raise ValueError(f"dataset {self.name!r} lacks columns {missing}")

    def content_hash(self) -> str:
        """A short, stable hash of the interactions (recorded in the export manifest)."""
        digest = hashlib.sha256()
        for column in INTERACTION_COLUMNS:
            digest.update(self.interactions[column].to_numpy().tobytes())
        digest.update(str(len(self.users)).encode())
        digest.update(str(len(self.items)).encode())
        return digest.hexdigest()[:16]


def oldest_rows(dataset: RawDataset, fraction: float) -> np.ndarray:
    """Positions of the oldest ``fraction`` of the interactions (by time), in row order."""
    order = np.argsort(dataset.interactions["timestamp"].to_numpy(), kind="stable")
    return np.sort(order[: round(min(fraction, 1.0) * len(order))])


def oldest(dataset: RawDataset, fraction: float) -> RawDataset:
    """The data set cut to its oldest ``fraction`` of interactions (by time): the newest part
    held back as traffic to replay (tests, benchmark), or as what arrived after production
    was trained (``cascade train --base-fraction``, the retrain walkthrough)."""
    if fraction >= 1.0:
        return dataset
    kept = oldest_rows(dataset, fraction)
    return RawDataset(
        f"{dataset.name}-oldest{fraction:g}",
        dataset.users,
        dataset.items,
        dataset.interactions.iloc[kept].reset_index(drop=True),
        schema=dataset.schema,
        user_ids=dataset.user_ids,
        item_ids=dataset.item_ids,
    )
