"""The ETL step: split, fit the feature workflow, write the model inputs.

Writes into a work directory:

- ``workflow/``: the fitted feature workflow (serving loads the exported copy);
- ``ranking_{train,valid,test}.parquet``: DLRM/GBM rows (rating == 3 dropped), training
  rows written in random order, so every row group is already a random sample (on a Dask
  cluster, a sample stratified by partition: ``pipelines/prepare_distributed.py``);
- ``retrieval.npz``: tower inputs per catalog user and item, each user's recent history,
  retrieval positives of each split, item sampling log-probabilities (log-Q).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from core.errors import ConfigError, DataError
from core.features.ops import Columns
from core.features.rows import AttributeTable, labelled_rows
from core.features.schema import FeatureSchema
from core.features.spec import DENSE, LABEL, WEIGHT, build_workflow
from core.features.workflow import Workflow
from core.ids import ITEM_ID_MAP, USER_ID_MAP
from pipelines.data.schema import RawDataset
from pipelines.split import POSITIVE_RATING, Split, hashed_split
from pipelines.storage import flatten, write_parquet

SPLITS = ("train", "valid", "test")


def ranking_parquet_columns(schema: FeatureSchema) -> tuple[str, ...]:
    """The columns of ``ranking_*.parquet``: sparse ids, dense, multi-hot blocks, label."""
    return (*schema.sparse_columns, DENSE, *schema.multi_hot_columns, LABEL)


@dataclass
class RetrievalData:
    """Tower inputs indexed by catalog position (users table order, items table order)."""

    user_ids: np.ndarray  # [n_users] raw ids
    item_ids: np.ndarray  # [n_items] raw ids
    user_features: np.ndarray  # [n_users, len(schema.user_tower_columns)] int64
    history: np.ndarray  # [n_users, history_length] item_id_idx, 0 = padding
    item_features: np.ndarray  # [n_items, len(schema.item_tower_columns)] int64
    item_dense: np.ndarray  # [n_items, item multi-hot widths + 1] float32
    item_log_q: np.ndarray  # [n_items] log sampling probability of each item as a positive
    positives: dict[str, np.ndarray]  # split -> [n, 2] (user position, item position)
    # values computed from the fields above once and kept (the evaluation's per-user groups)
    derived: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def save(self, path: Path) -> None:
        arrays: dict[str, Any] = {
            "user_ids": self.user_ids,
            "item_ids": self.item_ids,
            "user_features": self.user_features,
            "history": self.history,
            "item_features": self.item_features,
            "item_dense": self.item_dense,
            "item_log_q": self.item_log_q,
            **{f"positives_{k}": v for k, v in self.positives.items()},
        }
        np.savez(path, **arrays)

    @classmethod
    def load(cls, path: Path) -> RetrievalData:
        with np.load(path, allow_pickle=False) as saved:
            fields = {k: saved[k] for k in saved.files}
        positives = {
            k[len("positives_") :]: fields.pop(k)
            for k in list(fields)
            if k.startswith("positives_")
        }
        return cls(positives=positives, **fields)


def _take(columns: Columns, rows: np.ndarray) -> Columns:
    return {k: v[rows] for k, v in columns.items()}


def catalog_positions(
    ids: np.ndarray, catalog: np.ndarray | pd.Index, what: str, source: str
) -> np.ndarray:
    """The position of each of ``ids`` in ``catalog`` (unique ids; an index of them is
    reused), by hash lookup: 20x a sorted search for 10M ids in a 1M catalog. An id the
    catalog lacks fails with a ``DataError`` naming ``source`` and ``what`` ("user",
    "item"), never a wrong position."""
    index = catalog if isinstance(catalog, pd.Index) else pd.Index(catalog)
    positions = index.get_indexer(ids)  # type: ignore[arg-type]  # numpy arrays are fine
    unknown = positions < 0
    if unknown.any():
        examples = ", ".join(str(i) for i in np.unique(np.asarray(ids)[unknown])[:5])
        raise DataError(
            source,
            f"{int(unknown.sum())} interactions name a {what} id missing from the {what}s "
            f"table (for example {examples})",
        )
    return positions.astype(np.int64)


def positive_pairs(
    interactions: pd.DataFrame, catalog: tuple[pd.Index, pd.Index], source: str
) -> np.ndarray:
    """``[n, 2]`` catalog positions (user, item) of the positives among ``interactions``, in
    row order (``catalog``: the indexes of the user and item ids)."""
    chosen = interactions[interactions["rating"] >= POSITIVE_RATING]
    return np.stack(
        [
            catalog_positions(chosen[f"{what}_id"].to_numpy(), index, what, source)
            for what, index in zip(("user", "item"), catalog, strict=True)
        ],
        axis=1,
    )


def item_log_q(positive_counts: np.ndarray) -> np.ndarray:
    """Each item's log sampling probability as a training positive, from its count of
    training positives (add-one smoothed, so no item has probability 0)."""
    counts = positive_counts + 1.0
    return np.log(counts / counts.sum()).astype(np.float32)


def user_tower_inputs(workflow: Workflow, users: pd.DataFrame) -> np.ndarray:
    """``[n, len(user_tower_columns)]`` ids for raw user rows (used offline and online)."""
    schema = workflow.schema
    raw = {c: users[c].to_numpy() for c in ("user_id", *schema.user_attributes)}
    encoded = workflow.transform(raw, partial=True)
    return np.stack([encoded[c] for c in schema.user_tower_columns], axis=1)


def item_tower_inputs(workflow: Workflow, items: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Item ids ``[n, len(item_tower_columns)]`` and dense ``[n, multi-hot widths + 1]`` (the
    item's multi-hot features and its interaction count) of raw items."""
    schema = workflow.schema
    raw = {c: items[c].to_numpy() for c in ("item_id", *schema.item_attributes)}
    encoded = workflow.transform(raw, partial=True)
    features = np.stack([encoded[c] for c in schema.item_tower_columns], axis=1)
    multi = [encoded[f"{f.name}_multi_hot"] for f in schema.item_multi]
    dense = np.concatenate([*multi, encoded["item_id_idx_count"][:, None]], axis=1)
    return features, dense.astype(np.float32)


def recent_history(
    workflow: Workflow,
    interactions: pd.DataFrame,
    user_ids: np.ndarray,
    length: int,
    source: str = "interactions",
) -> np.ndarray:
    """Each user's last ``length`` positives (newest last) as item_id_idx, left-padded with 0."""
    positives = interactions[interactions["rating"] >= POSITIVE_RATING].sort_values(
        ["user_id", "timestamp"]
    )
    item_idx = workflow.transform({"item_id": positives["item_id"].to_numpy()}, partial=True)[
        "item_id_idx"
    ]
    users = positives["user_id"].to_numpy()
    # rank of each row from the end of its user's run: keep the last ``length``
    run_end = (
        np.r_[np.flatnonzero(users[1:] != users[:-1]), len(users) - 1]
        if len(users)
        else np.array([], int)
    )
    run_id = np.repeat(np.arange(len(run_end)), np.diff(np.r_[-1, run_end]))
    from_end = run_end[run_id] - np.arange(len(users)) if len(users) else np.array([], int)
    keep = from_end < length
    history = np.zeros((len(user_ids), length), dtype=np.int64)
    rows = catalog_positions(users[keep], user_ids, "user", source)
    history[rows, length - 1 - from_end[keep]] = item_idx[keep]
    return history


def write_online_tables(dataset: RawDataset, directory: Path, history_length: int) -> None:
    """What the serving side's online store holds, as parquet: the id maps (string ids),
    ``users`` (raw attributes),
    ``items`` (raw attributes), ``histories`` (per user: the last ``history_length`` positive
    item ids, oldest first, and every item the user has interacted with)."""
    directory.mkdir(parents=True, exist_ok=True)
    dataset.user_ids.save(directory / USER_ID_MAP)  # string ids only: integers need no map
    dataset.item_ids.save(directory / ITEM_ID_MAP)
    dataset.users.to_parquet(directory / "users.parquet", index=False)
    dataset.items.to_parquet(directory / "items.parquet", index=False)
    pq.write_table(
        user_histories(dataset.interactions, history_length), directory / "histories.parquet"
    )


def _starts(sorted_keys: np.ndarray) -> np.ndarray:
    """Where each run of equal values begins in ``sorted_keys``."""
    if not len(sorted_keys):
        return np.zeros(0, np.int64)
    return np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])


def _pair_keys(
    first: np.ndarray, second: np.ndarray
) -> tuple[np.ndarray, tuple[int, int, int]] | None:
    """One int64 per (first, second) that orders as the pair does, with what decodes it
    (``first``'s and ``second``'s lowest values, ``second``'s span: a key is
    ``(first - base) * span + (second - low)``); None where the pairs need over 63 bits."""
    if not len(first):
        return None
    base, low = int(first.min()), int(second.min())
    span = int(second.max()) - low + 1
    if (int(first.max()) - base + 1) * span >= 1 << 63:
        return None
    return (first - base) * span + (second - low), (base, low, span)


def user_histories(interactions: pd.DataFrame, history_length: int) -> pa.Table:
    """Per user with interactions, in user id order: ``seen`` (every item interacted with,
    sorted, once) and ``recent`` (the last ``history_length`` positive items by time, oldest
    first; rows at the same time in row order), as list columns built from offsets (no
    array per user: a partition's 400k users took 9 s that way)."""
    users = interactions["user_id"].to_numpy(np.int64)
    items = interactions["item_id"].to_numpy(np.int64)
    times = interactions["timestamp"].to_numpy(np.int64)
    by_time = _pair_keys(users, times)  # one stable sort of int64 keys: 3x a lexsort
    order = np.lexsort((times, users)) if by_time is None else np.argsort(by_time[0], kind="stable")
    users, items = users[order], items[order]
    liked = interactions["rating"].to_numpy()[order] >= POSITIVE_RATING
    user_ids = users[_starts(users)]

    by_item = _pair_keys(users, items)
    if by_item is None:
        pairs = np.lexsort((items, users))
        pair_users, pair_items = users[pairs], items[pairs]
        first = np.ones(len(pair_users), dtype=bool)
        first[1:] = (pair_users[1:] != pair_users[:-1]) | (pair_items[1:] != pair_items[:-1])
        seen_users, seen_items = pair_users[first], pair_items[first]
    else:  # a plain sort of the keys (vectorised), then each run once
        keys, (base, low, span) = by_item
        keys = np.sort(keys)
        keys = keys[_starts(keys)]
        seen_users, seen_items = keys // span + base, keys % span + low

    liked_users, liked_items = users[liked], items[liked]
    starts = _starts(liked_users)
    ends = np.append(starts[1:], len(liked_users))[: len(starts)].astype(np.int64)
    last = np.repeat(ends, ends - starts) - np.arange(len(liked_users)) <= history_length
    recent_users, recent_items = liked_users[last], liked_items[last]

    def lists(owners: np.ndarray, values: np.ndarray) -> pa.ListArray:
        offsets = np.r_[np.searchsorted(owners, user_ids), len(owners)].astype(np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int64()))

    return pa.table(
        {
            "user_id": pa.array(user_ids, pa.int64()),
            "seen": lists(seen_users, seen_items),
            "recent": lists(recent_users, recent_items),
        }
    )


def _fit_in_memory(
    dataset: RawDataset,
    workdir: Path,
    workflow: Workflow,
    split: Split,
    seed: int,
    ranking_columns: tuple[str, ...],
) -> None:
    """Fit ``workflow`` in this process and write the ranking rows (training rows in one
    random order)."""
    schema = dataset.schema
    users = AttributeTable(dataset.users, "user_id", schema.user_attributes)
    items = AttributeTable(dataset.items, "item_id", schema.item_attributes)
    rows = labelled_rows(dataset.interactions, users, items)
    encoded = {
        "train": workflow.fit_transform(_take(rows, split.train)),
        "valid": workflow.transform(_take(rows, split.valid)),
        "test": workflow.transform(_take(rows, split.test)),
    }
    rng = np.random.default_rng(seed)
    for name, columns in encoded.items():
        kept = np.flatnonzero(columns["rating"] != POSITIVE_RATING)
        if name == "train":
            kept = rng.permutation(kept)
        write_parquet(
            workdir / f"ranking_{name}.parquet",
            flatten(_take({c: columns[c] for c in ranking_columns}, kept), ranking_columns),
            row_group_size=65_536,
        )


def prepare(
    dataset: RawDataset,
    workdir: Path,
    seed: int = 0,
    history_length: int = 20,
    split: Split | None = None,
    fit_workers: int | None = None,
    dask_scheduler: str | None = None,
) -> Workflow:
    """Split (default: the hashed random 8:1:1 protocol; ``cascade retrain`` passes its
    holdout split), fit the workflow on the training rows, and write every model's inputs.

    With ``fit_workers`` (a local Dask cluster of that many workers) or ``dask_scheduler``
    (a running cluster's address) the workflow is fitted and the ranking rows written on the
    cluster (``pipelines/prepare_distributed.py``; the hashed split only)."""
    workdir.mkdir(parents=True, exist_ok=True)
    workflow = build_workflow(dataset.schema, seed=seed)
    ranking_columns = ranking_parquet_columns(dataset.schema)
    split = split if split is not None else hashed_split(dataset.interactions, seed)
    weights = dataset.interactions.get(WEIGHT)
    if weights is not None and not np.all(weights.to_numpy(np.float32) == 1.0):
        ranking_columns = (*ranking_columns, WEIGHT)  # weighted events: kept per row
    if fit_workers is None and dask_scheduler is None:
        _fit_in_memory(dataset, workdir, workflow, split, seed, ranking_columns)
    else:
        try:
            from pipelines import prepare_distributed
        except ModuleNotFoundError as missing:  # a train-only install has no Dask
            raise ConfigError(
                f"--fit-workers/--dask-scheduler need the distributed extra ({missing.name} "
                "is not installed): pip install 'cascade-recsys[distributed]'"
            ) from None

        prepare_distributed.fit_on_cluster(
            (fit_workers, dask_scheduler), dataset, split, workdir, workflow, seed, ranking_columns
        )
    workflow.save(workdir / "workflow")
    write_online_tables(dataset, workdir / "online", history_length)

    train_interactions = dataset.interactions.iloc[split.train]
    user_ids = dataset.users["user_id"].to_numpy()
    item_ids = dataset.items["item_id"].to_numpy()
    item_features, item_dense = item_tower_inputs(workflow, dataset.items)
    catalog = (pd.Index(user_ids), pd.Index(item_ids))
    positives = {
        name: positive_pairs(dataset.interactions.iloc[part], catalog, dataset.name)
        for name, part in zip(SPLITS, (split.train, split.valid, split.test), strict=True)
    }
    RetrievalData(
        user_ids=user_ids,
        item_ids=item_ids,
        user_features=user_tower_inputs(workflow, dataset.users),
        history=recent_history(
            workflow, train_interactions, user_ids, history_length, dataset.name
        ),
        item_features=item_features,
        item_dense=item_dense,
        item_log_q=item_log_q(np.bincount(positives["train"][:, 1], minlength=len(item_ids))),
        positives=positives,
    ).save(workdir / "retrieval.npz")
    return workflow
