"""A served release: the exported item catalog, ANN index, popularity and feature workflow.

Candidates are catalog positions (rows of ``items``); ``item_ids[position]`` is the internal
id, ``ids`` maps it to and from the data set's own (``services.serving.ids``), and ``rules``
are the business rules in internal ids.
A release is checked against its manifest's sha256 table before anything is read (its own
files and its models' files: the version is served as a whole), and ``load_served_releases``
falls back to the newest older version that verifies when the settings allow it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import faiss
import numpy as np
import pandas as pd

from core.errors import ArtifactError
from core.export.item_index import load_index
from core.export.repository import MANIFEST, complete_versions, latest_version
from core.export.verify import verify_version
from core.features.rows import AttributeTable
from core.features.schema import FeatureSchema
from core.features.workflow import Workflow
from core.item_neighbors import DIRECTORY as NEIGHBORS
from core.item_neighbors import ItemNeighbors
from services.serving.ids import ReleaseIds
from services.serving.request_features import RequestFeatures
from services.serving.rules import Rules

log = logging.getLogger(__name__)


AVAILABLE = "available"  # the item feature (bool) that takes an item out of answers


@dataclass
class Release:
    version: int
    manifest: dict
    item_ids: np.ndarray  # [n_items] raw ids, by catalog position
    index: faiss.Index  # row i = catalog position i
    popularity: np.ndarray  # catalog positions, most popular first
    workflow: Workflow
    items: AttributeTable  # raw item attributes by id
    primary_genre: np.ndarray  # [n_items] first category ('' if none): diversity's key
    genres: np.ndarray  # [n_items] '|'-joined categories (rules' `genres:`; ``categories``)
    features: RequestFeatures  # a request's model inputs
    # the second retrieval source and the item embeddings that score its candidates (memory
    # mapped: only the rows read are paged in); None for a release exported without them
    neighbors: ItemNeighbors | None = None
    embeddings: np.ndarray | None = None
    ids: ReleaseIds = field(default_factory=ReleaseIds.identity)  # external <-> internal ids
    # catalog positions whose `available` item feature is false: never answered
    unavailable: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rules: Rules = field(default_factory=Rules)  # the business rules, in internal item ids

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


def load_release(root: Path, version: int | None = None, rules: Rules | None = None) -> Release:
    """Load ``releases/<version>`` (default: the newest complete one) from the export root,
    with its id maps and ``rules`` mapped to its internal item ids."""
    version = version if version is not None else latest_version(root)
    if version is None:
        raise ArtifactError(
            f"no complete release under {root / 'releases'}: run `cascade train` first"
        )
    directory = root / "releases" / str(version)
    if not (directory / MANIFEST).is_file():
        raise ArtifactError(f"{directory} has no {MANIFEST} (missing or incomplete export)")
    manifest = json.loads((directory / MANIFEST).read_text())
    models = manifest.get("models", {})
    checked = verify_version(
        root,
        version,
        [f"releases/{version}", *(f"model_repository/{m}/{v}" for m, v in models.items())],
    )
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
    workflow = Workflow.load(directory / "workflow")
    by_position = items.set_index("item_id").reindex(item_ids)
    genres = categories(by_position, workflow.schema)
    table = AttributeTable(items, "item_id", workflow.schema.item_attributes)
    item_columns = workflow.transform(  # the catalog's features, encoded once per release
        {"item_id": item_ids, **table.lookup(item_ids)}, partial=True
    )
    release = Release(
        version=version,
        manifest=manifest,
        item_ids=item_ids,
        index=index,
        popularity=np.zeros(0, np.int64),
        workflow=workflow,
        items=table,
        primary_genre=np.asarray([g.split("|")[0] for g in genres]),
        genres=genres,
        unavailable=unavailable_positions(by_position, workflow.schema),
        features=RequestFeatures(workflow, item_columns, int(manifest["config"]["history_length"])),
        ids=ReleaseIds.load(directory / "online", item_ids, {root / n for n in checked.unlisted}),
    )
    release.rules = (rules or Rules()).for_items(release.ids.items, f"release {version}")
    release.popularity = release.positions(np.asarray(popular, dtype=np.int64))
    if (directory / NEIGHBORS).is_dir():
        release.neighbors, release.embeddings = _neighbor_source(directory, index)
    return release


def unavailable_positions(items: pd.DataFrame, schema: FeatureSchema) -> np.ndarray:
    """Positions of the items (in ``items``' row order) whose bool feature ``available`` is
    false (false, 0, "false", "no"); a missing value counts as available."""
    if not any(f.name == AVAILABLE and f.kind == "bool" for f in schema.item):
        return np.zeros(0, np.int64)
    text = items[AVAILABLE].astype(object).map(lambda v: str(v).strip().lower())
    return np.flatnonzero(text.isin(["false", "0", "0.0", "no", "n", "f"]).to_numpy())


def categories(items: pd.DataFrame, schema: FeatureSchema) -> np.ndarray:
    """Each item's categories, ``|``-joined: the values of its first multi-categorical
    feature (MovieLens: genres), else of its first categorical one, else none. Business
    rules (``genres:``) and the diversity cap read them."""
    multi = schema.item_multi
    single = [f for f in schema.item if f.kind in ("categorical", "bool")]
    if multi:
        values = items[multi[0].name].fillna("").astype(str)
        separator = multi[0].separator or "|"
        if separator != "|":
            values = values.str.replace(separator, "|", regex=False)
    elif single:
        values = items[single[0].name].astype(object).where(items[single[0].name].notna(), "")
        values = values.astype(str)
    else:
        return np.full(len(items), "", dtype=str)
    return values.to_numpy(dtype=str)


def _neighbor_source(directory: Path, index: faiss.Index) -> tuple[ItemNeighbors, np.ndarray]:
    try:
        neighbors = ItemNeighbors.load(directory / NEIGHBORS, mmap=True)
        embeddings = np.load(directory / "item_embeddings.npy", mmap_mode="r")
    except (OSError, ValueError) as error:
        raise ArtifactError(
            f"{directory}: cannot read the item-neighbour source ({error})"
        ) from None
    if neighbors.n_items != index.ntotal or embeddings.shape != (index.ntotal, index.d):
        raise ArtifactError(
            f"{directory}: the neighbour table has {neighbors.n_items} rows and the embeddings "
            f"{embeddings.shape}; the index has {index.ntotal} of dimension {index.d}"
        )
    return neighbors, embeddings


@dataclass
class ServedReleases:
    """What a gateway serves: the releases by version, the default and canary versions, and
    one line per version that was asked for but refused (for readiness details)."""

    releases: dict[int, Release]
    default: int
    canary: int | None
    problems: list[str]


def _newest_that_loads(
    root: Path, fallback: bool, rules: Rules | None
) -> tuple[Release, list[str]]:
    versions = complete_versions(root)[::-1]
    if not versions:
        raise ArtifactError(
            f"no complete release under {root / 'releases'}: run `cascade train` first"
        )
    refused: list[tuple[int, ArtifactError]] = []
    for version in versions:
        try:
            release = load_release(root, version, rules)
        except ArtifactError as error:
            if not fallback:
                raise ArtifactError(
                    f"release {version} cannot be served: {error} (CASCADE_ARTIFACT_FALLBACK "
                    "is off; turn it on to serve the newest older version that verifies)"
                ) from error
            log.error("release %d cannot be served: %s", version, error)
            refused.append((version, error))
            continue
        problems = [
            f"release {v} refused ({error}); serving release {release.version}, the newest "
            "that verifies"
            for v, error in refused
        ]
        if refused:
            log.warning(
                "serving release %d instead of release %d, which failed verification",
                release.version,
                refused[0][0],
            )
        return release, problems
    raise ArtifactError(
        f"no release under {root / 'releases'} verifies; the newest: {refused[0][1]}"
    ) from refused[0][1]


def load_served_releases(
    root: Path, pinned: int | None, canary: int | None, fallback: bool, rules: Rules | None = None
) -> ServedReleases:
    """Load the releases a gateway serves, each verified (blocking: it hashes the files).

    - ``pinned`` (CASCADE_MODEL_VERSION) is served or ``ArtifactError`` is raised: never
      silently another version than the one pinned.
    - Unpinned: the newest complete version; when it fails (a corrupted or missing file) and
      ``fallback`` is on, the newest older version that loads, with a problem line and a
      log line naming both.
    - A ``canary`` that fails is dropped when ``fallback`` is on (every user goes to the
      default; the rollout's analysis sees a canary without traffic and rolls back), else
      raises.
    """
    problems: list[str] = []
    if pinned is not None:
        try:
            default = load_release(root, pinned, rules)
        except ArtifactError as error:
            raise ArtifactError(
                f"release {pinned} is pinned (CASCADE_MODEL_VERSION) and cannot be served: "
                f"{error}. The gateway does not start rather than serve another version: "
                "restore the file, or pin a version that verifies"
            ) from error
    else:
        default, problems = _newest_that_loads(root, fallback, rules)
    releases = {default.version: default}
    if canary is not None and canary not in releases:
        try:
            releases[canary] = load_release(root, canary, rules)
        except ArtifactError as error:
            if not fallback:
                raise
            problems.append(
                f"canary release {canary} refused ({error}); every user is routed to release "
                f"{default.version}"
            )
            log.error("%s", problems[-1])
            canary = None
    return ServedReleases(releases, default.version, canary, problems)
