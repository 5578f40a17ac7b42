"""Reference distributions for drift monitoring, written next to each exported version.

The monitored quantities are read from what the served models get at request time (the
ranker's ``sparse``/``dense`` inputs, the retrieval and ranking scores, the user's history
length), so serving and export extract them with the same code (``user_values`` /
``item_values`` below).

How the reference is made (``replay_reference``, ``pipelines/export/drift_replay.py``): a sample
of the catalog's users (each user once: the population the version was trained for) goes through
the trained models the way a gateway serves them: query tower -> ANN top ``candidates`` -> seen
items removed -> ranking rows built by the fitted workflow -> ranker -> sigmoid. Training
interactions would not do: they weight users by activity and items by what users chose, while
the gateway sees one request per user visit and the items the retrieval proposes, so stationary
traffic would look drifted. Request timestamps are drawn uniformly over the week before the
export, so the time features (hour, weekday, item age) the ranker reads look like live traffic.

Bins: quantile edges of the reference values (``bins`` bins by default 10), deduplicated (a
discrete feature gets one bin per distinct value at most), with open outer bins: value ``v``
falls in bin ``searchsorted(edges, v, side="right")``, so everything below the first edge
(e.g. an unknown category, code 0) and above the last lands somewhere. Item-side values are
weighted ``1 / candidates of that user`` so every replayed request counts once, as a gateway
that samples a fixed number of candidates per request counts them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.errors import ArtifactError
from core.features.schema import FeatureSchema

REFERENCE_FILE = "drift_reference.json"
FORMAT_VERSION = 1
DEFAULT_BINS = 10

# One value per request: (quantity, "sparse" | "dense", model input column).
USER_INPUTS = (
    ("user_gender", "sparse", "gender_idx"),
    ("user_age", "sparse", "age_idx"),
    ("user_occupation", "sparse", "occupation_idx"),
    ("user_activity", "dense", "user_id_idx_count"),
    ("user_target_mean", "dense", "user_id_idx_te_label"),
    ("user_mean_item_year", "dense", "user_mean_item_year"),
)
HISTORY_LENGTH = "history_length"
# One value per scored candidate (sampled at serving time).
ITEM_INPUTS = (
    ("item_year", "sparse", "year_idx"),
    ("item_genre", "sparse", "genres_first_idx"),
    ("item_popularity", "dense", "item_id_idx_count"),
    ("item_target_mean", "dense", "item_id_idx_te_label"),
    ("item_mean_user_age", "dense", "item_mean_user_age"),
)
RETRIEVAL_SCORE = "retrieval_score"
RANKING_SCORE = "ranking_score"
USER_QUANTITIES = (*(name for name, _, _ in USER_INPUTS), HISTORY_LENGTH)
ITEM_QUANTITIES = (*(name for name, _, _ in ITEM_INPUTS), RETRIEVAL_SCORE, RANKING_SCORE)
QUANTITIES = (*USER_QUANTITIES, *ITEM_QUANTITIES)  # the only `feature` label values


def _picker(
    inputs: tuple[tuple[str, str, str], ...], schema: FeatureSchema
) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """The input columns of ``inputs`` from ranker rows, in order; NaN where ``schema`` lacks
    the column (a data set without that feature: its quantity is not monitored)."""
    sources = {"sparse": list(schema.sparse_columns), "dense": list(schema.dense_inputs)}
    found = [
        (i, kind == "sparse", sources[kind].index(c))
        for i, (_, kind, c) in enumerate(inputs)
        if c in sources[kind]
    ]

    def pick(sparse: np.ndarray, dense: np.ndarray) -> np.ndarray:
        out = np.full((*sparse.shape[:-1], len(inputs)), np.nan)
        for i, from_sparse, at in found:
            out[..., i] = (sparse if from_sparse else dense)[..., at]
        return out

    return pick


class Extractor:
    """The monitored quantities of a schema's ranker rows (quantities whose input column the
    schema lacks come out NaN and are left out of the reference)."""

    def __init__(self, schema: FeatureSchema) -> None:
        self._user = _picker(USER_INPUTS, schema)
        self._item = _picker(ITEM_INPUTS, schema)

    def user_values(
        self, sparse_row: np.ndarray, dense_row: np.ndarray, history_length: int
    ) -> np.ndarray:
        """``[len(USER_QUANTITIES)]`` float64 from one ranker input row (user columns are the
        same on every row of a request) and the user's history length."""
        return np.concatenate([self._user(sparse_row, dense_row), [history_length]])

    def item_values(
        self, sparse: np.ndarray, dense: np.ndarray, retrieval: np.ndarray, ranking: np.ndarray
    ) -> np.ndarray:
        """``[rows, len(ITEM_QUANTITIES)]`` float64 from ranker input rows and their scores."""
        parts = [self._item(sparse, dense), retrieval[:, None], ranking[:, None]]
        return np.concatenate(parts, axis=1).astype(np.float64)


def weighted_quantiles(values: np.ndarray, weights: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Inverted-CDF quantiles (each result is a value of ``values``) under ``weights``."""
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    at = np.searchsorted(cumulative, q * cumulative[-1], side="left")
    return values[order][np.minimum(at, len(values) - 1)]


@dataclass
class Reference:
    """One quantity's bins: ``edges`` (sorted, unique) and the reference share of each of
    the ``len(edges) + 1`` bins."""

    edges: np.ndarray
    proportions: np.ndarray
    samples: int

    @classmethod
    def fit(cls, values: np.ndarray, weights: np.ndarray | None, bins: int) -> Reference:
        """Quantile bins of ``values`` and their weighted shares."""
        values = np.asarray(values, np.float64)
        finite = np.isfinite(values)
        values = values[finite]
        if len(values) == 0:
            raise ArtifactError("no finite reference values to bin")
        w = np.ones(len(values)) if weights is None else np.asarray(weights, np.float64)[finite]
        edges = np.unique(weighted_quantiles(values, w, np.arange(1, bins) / bins))
        counts = np.bincount(np.searchsorted(edges, values, "right"), w, len(edges) + 1)
        return cls(edges, counts / counts.sum(), len(values))

    def as_dict(self) -> dict:
        return {
            "edges": self.edges.tolist(),
            "proportions": self.proportions.tolist(),
            "samples": self.samples,
        }


def write_reference(path: Path, references: dict[str, Reference], method: dict) -> None:
    """Write the reference file (quantities in ``QUANTITIES`` order)."""
    body = {
        "format_version": FORMAT_VERSION,
        "method": method,
        "quantities": {q: references[q].as_dict() for q in QUANTITIES if q in references},
    }
    path.write_text(json.dumps(body, indent=1))


def read_reference(path: Path) -> dict[str, Reference]:
    """The references of a file, for the quantities this code knows (others are ignored, so
    that label values stay a fixed set). Raises ``ArtifactError`` naming what is wrong."""
    try:
        body = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ArtifactError(f"{path}: cannot read the drift reference ({error})") from None
    if not isinstance(body, dict) or body.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(f"{path}: format_version is not {FORMAT_VERSION}")
    references = {}
    for name in QUANTITIES:
        entry = body.get("quantities", {}).get(name)
        if entry is None:
            continue
        edges = np.asarray(entry["edges"], np.float64)
        proportions = np.asarray(entry["proportions"], np.float64)
        if len(proportions) != len(edges) + 1 or np.any(np.diff(edges) <= 0):
            raise ArtifactError(f"{path}: {name}: edges must increase and bins = edges + 1")
        references[name] = Reference(edges, proportions, int(entry["samples"]))
    return references
