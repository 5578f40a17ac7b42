"""A served release: the exported item catalog, ANN index, popularity and feature workflow.

Candidates are catalog positions (rows of ``items``); ``item_ids[position]`` is the raw id.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import faiss
import numpy as np
import pandas as pd

from pipelines.errors import ArtifactError
from pipelines.export.item_index import load_index
from pipelines.export.repository import MANIFEST, latest_version
from pipelines.features.ops import Columns
from pipelines.features.rows import ITEM_ATTRIBUTES, AttributeTable
from pipelines.features.workflow import Workflow


@dataclass
class Release:
    version: int
    manifest: dict
    item_ids: np.ndarray  # [n_items] raw ids, by catalog position
    index: faiss.Index  # row i = catalog position i
    popularity: np.ndarray  # catalog positions, most popular first
    workflow: Workflow
    items: AttributeTable  # raw item attributes by id
    primary_genre: np.ndarray  # [n_items] first genre name ('' if none)
    genres: np.ndarray  # [n_items] '|'-joined genre names
    item_columns: Columns = field(default_factory=dict)  # item-side features, by position

    def positions(self, ids: np.ndarray) -> np.ndarray:
        """Catalog positions of raw item ids; -1 for ids not in the catalog."""
        ids = np.asarray(ids, dtype=np.int64)
        where = np.searchsorted(self._sorted_ids, ids)
        where = np.minimum(where, len(self._sorted_ids) - 1)
        found = self._sorted_ids[where] == ids
        return np.where(found, self._order[where], -1)

    def __post_init__(self) -> None:
        self._order = np.argsort(self.item_ids, kind="stable")
        self._sorted_ids = self.item_ids[self._order]


def load_release(root: Path, version: int | None = None) -> Release:
    """Load ``releases/<version>`` (default: the newest complete one) from the export root."""
    version = version if version is not None else latest_version(root)
    if version is None:
        raise ArtifactError(
            f"no complete release under {root / 'releases'}: run `cascade train` first"
        )
    directory = root / "releases" / str(version)
    if not (directory / MANIFEST).is_file():
        raise ArtifactError(f"{directory} has no {MANIFEST} (missing or incomplete export)")
    manifest = json.loads((directory / MANIFEST).read_text())
    item_ids = np.load(directory / "item_ids.npy")
    index = load_index(directory / "item_index.faiss")
    if index.ntotal != len(item_ids):
        raise ArtifactError(f"{directory}: index has {index.ntotal} rows, item_ids {len(item_ids)}")
    if faiss.get_num_gpus() > 0:  # pragma: no cover - needs a GPU
        index = faiss.index_cpu_to_all_gpus(index)
    elif hasattr(index, "nprobe"):
        faiss.omp_set_num_threads(1)  # one request's search is small; leave cores to others
    popular = json.loads((directory / "popularity.json").read_text())["item_ids"]
    items = pd.read_parquet(directory / "online" / "items.parquet")
    by_position = items.set_index("item_id").reindex(item_ids)
    genres = by_position["genres"].fillna("").to_numpy(dtype=str)
    release = Release(
        version=version,
        manifest=manifest,
        item_ids=item_ids,
        index=index,
        popularity=np.zeros(0, np.int64),
        workflow=Workflow.load(directory / "workflow"),
        items=AttributeTable(items, "item_id", ITEM_ATTRIBUTES),
        primary_genre=np.asarray([g.split("|")[0] for g in genres]),
        genres=genres,
    )
    release.popularity = release.positions(np.asarray(popular, dtype=np.int64))
    raw = {"item_id": item_ids, **release.items.lookup(item_ids)}
    release.item_columns = release.workflow.transform(raw, partial=True)  # encoded once
    return release
