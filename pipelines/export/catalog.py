"""A catalog update: new or changed items into a new version, without retraining.

``update_catalog`` reads an item table (parquet, CSV or JSON lines: the release's item key
and every item feature of its schema), checks it as ingest checks a data set's item table
(missing column, null key, duplicate key with other attributes, a value of the wrong type:
one error naming the file, the column and a row), merges it into the base version's items
(new items appended with ids that extend the release's id map, changed attributes replaced,
items not in the file kept as they are), embeds the new and changed items with the release's
exported item tower (``item_tower.onnx``) through its fitted workflow, rebuilds the ANN
index and writes the result as the next version: the base version's models copied, its
workflow and online tables, the new item table, index, embeddings, item ids and popularity,
and a complete manifest. The version is claimed, staged and published as an export is
(``VersionWriter``): a failed update leaves nothing, and nothing is written before the table
has been checked. A new version goes live the way every version does (registry, rollout).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from core.errors import ArtifactError, DataError
from core.export.item_index import build_index, index_kind, save_index
from core.export.repository import VersionWriter, latest_version
from core.export.verify import MANIFEST, verify_version
from core.features.schema import Feature, FeatureSchema
from core.features.workflow import Workflow
from core.ids import ITEM_ID_MAP, IdMap
from core.item_neighbors import DIRECTORY as NEIGHBORS
from core.item_neighbors import ItemNeighbors
from pipelines.data.dataset_file import FeatureSpec, TableSpec
from pipelines.data.ingest_ids import KindMismatch, SideIds
from pipelines.data.ingest_tables import read_table
from pipelines.export.exporter import ITEM_TOWER
from pipelines.export.onnx_models import run_item_tower
from pipelines.prepare import item_tower_inputs

ITEMS = "items.parquet"  # the release's item table, in online/
EMBED_BATCH = 65_536  # items per item-tower call


@dataclass(frozen=True)
class CatalogUpdate:
    """What an update did: the versions, and how many items it added, changed or left."""

    base: int
    version: int
    added: int
    changed: int
    unchanged: int
    items: int
    manifest: Path


def read_item_table(
    path: Path,
    key: str,
    features: tuple[Feature, ...],
    id_map: IdMap,
    delimiter: str = ",",
) -> tuple[pd.DataFrame, IdMap]:
    """The table at ``path`` as the release stores items: ``item_id`` (internal ids, those
    ``id_map`` lacks numbered on after it) and each feature (multi-categorical values joined
    by the feature's ``separator``, which the file may use for delimited text), one row per
    key; and ``id_map`` extended with the new ids. DataError naming file, column and row."""
    ids = SideIds("item", id_map.kind)
    if id_map.kind == "str" and len(id_map):
        ids.known.ids(pa.array(id_map.external.tolist(), pa.string()))  # keep 1..N
    spec = TableSpec(
        path=str(path.absolute()),
        key=key,
        delimiter=delimiter,
        features={f.name: FeatureSpec(kind=f.kind) for f in features},
    )
    try:
        table = read_table(path, spec, features, ids)
    except KindMismatch:
        raise DataError(
            path, f"column {key!r}: item ids must be integers here (this release's ids are)"
        ) from None
    frame = table.frame.rename(columns={"id": "item_id"})
    for feature in features:
        chosen = table.separators.get(feature.name)
        stored = feature.separator or "|"
        if chosen is None or chosen == stored:
            continue
        values = frame[feature.name].astype(str)
        clash = values.str.contains(stored, regex=False)
        if clash.any():
            raise DataError(
                path,
                f"column {feature.name!r}: a value holds {stored!r}, the separator this "
                f"release stores (first: {values[clash].iloc[0]!r})",
            )
        frame[feature.name] = values.str.split(chosen, regex=False).str.join(stored)
    extended = ids.id_map() if id_map.kind == "str" else id_map
    return frame.reset_index(drop=True), extended


def _same(old: pd.Series, new: pd.Series) -> np.ndarray:
    """Row-wise equality of two aligned columns, nulls equal to nulls."""
    both_null = old.isna().to_numpy() & new.isna().to_numpy()
    if old.dtype.kind == "f" or new.dtype.kind == "f":
        a = pd.to_numeric(old, errors="coerce").to_numpy(np.float64)
        b = pd.to_numeric(new, errors="coerce").to_numpy(np.float64)
        return both_null | np.isclose(a, b, rtol=1e-6, atol=0, equal_nan=True)
    return both_null | (old.astype(str).to_numpy() == new.astype(str).to_numpy())


def _merge(
    items: pd.DataFrame, update: pd.DataFrame, schema: FeatureSchema
) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """The merged item table (existing rows in place, new ones appended), and the positions
    of the changed and of the added rows."""
    names = list(schema.item_attributes)
    known = pd.Index(items["item_id"]).get_indexer(update["item_id"])
    present = update[known >= 0]
    where = known[known >= 0]
    changed = np.zeros(len(present), bool)
    merged = items.copy()
    for name in names:
        old = merged[name].iloc[where].reset_index(drop=True)
        new = present[name].reset_index(drop=True)
        changed |= ~_same(old, new)
    rows = where[changed]
    for name in names:
        values = present[name].to_numpy()[changed]
        if merged[name].dtype.kind == "f":
            values = values.astype(merged[name].dtype)
        column = merged[name].to_numpy(copy=True)
        if column.dtype.kind not in "fO" and column.dtype.kind != values.dtype.kind:
            column = column.astype(object)
        column[rows] = values
        merged[name] = column
    added = update[known < 0].reindex(columns=merged.columns)
    for name in names:
        kind = merged[name].dtype.kind
        if kind == "f" or (kind == "b" and added[name].notna().all()):
            added[name] = added[name].astype(merged[name].dtype)
    merged = pd.concat([merged, added], ignore_index=True)
    return merged, rows, np.arange(len(items), len(merged))


def _embed(release: Path, workflow: Workflow, items: pd.DataFrame) -> np.ndarray:
    """Served vectors of ``items`` (raw rows) from the release's exported item tower."""
    features, dense = item_tower_inputs(workflow, items)
    parts = [
        run_item_tower(
            release / ITEM_TOWER, features[i : i + EMBED_BATCH], dense[i : i + EMBED_BATCH]
        )
        for i in range(0, len(items), EMBED_BATCH)
    ]
    return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)


def _copy_models(writer: VersionWriter, root: Path, models: dict[str, int]) -> None:
    """Each model directory of the base version as this version's (hard links where the
    file system allows: the files are never written in place)."""

    def link(source: str, target: str) -> None:
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)

    for model, version in models.items():
        staged = writer.staging(model)
        source = root / "model_repository" / model / str(version)
        shutil.copytree(source, staged, dirs_exist_ok=True, copy_function=link)
        writer.publish(model, staged)


def update_catalog(
    root: Path, items_file: Path, base: int | None = None, key: str | None = None
) -> CatalogUpdate:
    """Merge ``items_file`` into version ``base`` (default: the newest) of the export root
    ``root`` and write the result as a new version (module docs)."""
    base = base if base is not None else latest_version(root)
    if base is None:
        raise ArtifactError(f"no complete release under {root / 'releases'}: train first")
    release = root / "releases" / str(base)
    if not (release / MANIFEST).is_file():
        raise ArtifactError(f"{release} has no {MANIFEST} (missing or incomplete export)")
    manifest = json.loads((release / MANIFEST).read_text())
    models = {str(m): int(v) for m, v in manifest.get("models", {}).items()}
    verify_version(
        root, base, [f"releases/{base}", *(f"model_repository/{m}/{v}" for m, v in models.items())]
    )
    if not (release / ITEM_TOWER).is_file():
        raise ArtifactError(
            f"{release} has no {ITEM_TOWER} (exported before catalog updates existed): "
            "export it again (`cascade train export`) to update its catalog"
        )
    workflow = Workflow.load(release / "workflow")
    schema = workflow.schema
    table = manifest.get("item_table") or {}
    separators = table.get("separators") or {}
    features = tuple(
        Feature(**{**f.__dict__, "separator": separators.get(f.name, f.separator)})
        if f.kind == "multi_categorical"
        else f
        for f in schema.item
    )
    id_map = IdMap.load(release / "online" / ITEM_ID_MAP)
    update, extended = read_item_table(
        items_file,
        key or table.get("key") or "item_id",
        features,
        id_map,
        table.get("delimiter") or ",",
    )
    items = pd.read_parquet(release / "online" / ITEMS)
    item_ids = np.load(release / "item_ids.npy")
    if len(items) != len(item_ids) or not np.array_equal(items["item_id"].to_numpy(), item_ids):
        items = items.set_index("item_id").reindex(item_ids).rename_axis("item_id").reset_index()
    merged, changed, added = _merge(items, update, schema)
    touched = np.concatenate([changed, added])
    embeddings = np.load(release / "item_embeddings.npy")
    if len(touched):
        fresh = _embed(release, workflow, merged.iloc[touched])
        embeddings = np.concatenate(
            [embeddings, np.zeros((len(added), embeddings.shape[1]), np.float32)]
        )
        embeddings[touched] = fresh
    new_ids = merged["item_id"].to_numpy(np.int64)

    writer = VersionWriter(root)
    version = writer.claim()
    try:
        _copy_models(writer, root, models)
        target = writer.release
        assert target is not None
        seed = int(manifest.get("config", {}).get("seed", 0))
        index = build_index(embeddings, seed=seed)
        save_index(index, target / "item_index.faiss")
        np.save(target / "item_embeddings.npy", embeddings)
        np.save(target / "item_ids.npy", new_ids)
        shutil.copy2(release / ITEM_TOWER, target / ITEM_TOWER)
        shutil.copytree(release / "workflow", target / "workflow")
        shutil.copytree(
            release / "online", target / "online", ignore=shutil.ignore_patterns(ITEMS, ITEM_ID_MAP)
        )
        merged.to_parquet(target / "online" / ITEMS, index=False)
        extended.save(target / "online" / ITEM_ID_MAP)
        for name in os.listdir(release):  # e.g. the drift reference: the models' own
            if name.endswith(".json") and name not in (
                MANIFEST,
                "popularity.json",
                "validation.json",
            ):
                shutil.copy2(release / name, target / name)
        popular = json.loads((release / "popularity.json").read_text())
        (target / "popularity.json").write_text(
            json.dumps(
                {
                    "item_ids": [*popular["item_ids"], *new_ids[added].tolist()],
                    "counts": [*popular["counts"], *([0.0] * len(added))],
                }
            )
        )
        if (release / NEIGHBORS).is_dir():  # the new items have no neighbours yet
            neighbors = ItemNeighbors.load(release / NEIGHBORS)
            width = neighbors.neighbors.shape[1]
            ItemNeighbors(
                np.concatenate([neighbors.neighbors, np.full((len(added), width), -1, np.int32)]),
                np.concatenate([neighbors.similarity, np.zeros((len(added), width), np.float32)]),
            ).save(target / NEIGHBORS)
        kept = {k: v for k, v in manifest.items() if k not in ("files", "version")}
        path = writer.finish(
            {
                **kept,
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "models": {model: version for model in models},
                "index": {
                    "kind": index_kind(index),
                    "items": int(index.ntotal),
                    "dim": int(index.d),
                },
                "item_table": {**table, "key": key or table.get("key") or "item_id"},
                "catalog_update": {
                    "base": base,
                    "file": str(items_file),
                    "added": len(added),
                    "changed": len(changed),
                    "unchanged": len(update) - len(changed) - len(added),
                },
            }
        )
    except BaseException:
        writer.abandon()
        raise
    return CatalogUpdate(
        base=base,
        version=version,
        added=len(added),
        changed=len(changed),
        unchanged=len(update) - len(changed) - len(added),
        items=len(merged),
        manifest=path,
    )
