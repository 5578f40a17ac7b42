"""The export step: turn a trained work directory into a new, versioned release."""

from __future__ import annotations

import importlib.util
import json
import py_compile
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.errors import ArtifactError, CascadeError
from core.export.drift_reference import REFERENCE_FILE, write_reference
from core.export.item_index import build_index, index_kind, save_index
from core.export.repository import VersionWriter
from core.export.triton_gpu_configs import PARTS
from core.features.workflow import Workflow
from core.item_neighbors import DIRECTORY as NEIGHBORS
from core.tree_ranker import TreeRanker, categorical_positions, tree_categorical, tree_features
from pipelines.config import TrainConfig
from pipelines.data.dataset_file import load_dataset_file
from pipelines.export.drift_replay import replay_reference
from pipelines.export.gpu_target import export_gpu_parts, triton_parts
from pipelines.export.onnx_models import export_dlrm_dense, export_item_tower, export_query_tower
from pipelines.models.two_tower import ServedQuery
from pipelines.models.two_tower_ensemble import EnsembleQuery
from pipelines.prepare import RetrievalData
from pipelines.training.ranking import build_dlrm, ranking_inputs
from pipelines.training.retrieval import build_two_tower

QUERY_TOWER = "query_tower"
RANKER = "ranker"
ITEM_TOWER = "item_tower.onnx"  # in the release: what `cascade catalog update` embeds with
# config.pbtxt and the thin python-backend model.py of each served model (kept in git)
TEMPLATES = Path(__file__).resolve().parents[2] / "model_repository"


def _add_triton_files(root: Path, model: str, staged: Path) -> None:
    """Copy the model's ``model.py`` into the version, with its bytecode, and its
    ``config.pbtxt`` beside it.

    The bytecode is compiled here, checked by the source's hash (valid wherever the files
    are copied): otherwise Triton's python stub writes it into the version directory on the
    first load, and Triton, seeing a modified model on the next load of the model, creates
    that version's instances again (a canary's first load re-created production's, 7 s on
    2 cores; its promotion re-created the canary's). A Triton with another Python writes its
    own file beside this one, once.
    """
    template = TEMPLATES / model
    for name in ("config.pbtxt", "model.py"):
        if not (template / name).is_file():
            raise ArtifactError(f"{template / name} is missing (Triton model template)")
    shutil.copy(template / "model.py", staged / "model.py")
    source = str(staged / "model.py")
    py_compile.compile(
        source,
        cfile=importlib.util.cache_from_source(source),
        doraise=True,
        invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
    )
    target = root / "model_repository" / model / "config.pbtxt"
    temporary = target.with_suffix(".tmp")
    shutil.copy(template / "config.pbtxt", temporary)
    temporary.replace(target)


def _write_ranker(
    model_dir: Path, workdir: Path, workflow: Workflow, config: TrainConfig
) -> tuple[float, np.ndarray]:
    """DLRM dense part as ONNX, one ``.npy`` per embedding table, tree model, blend weight
    (and, for a GPU target, the Triton models the ranker calls). Returns the ONNX check's
    difference and validation rows of the trees' inputs (for the GPU target's check)."""
    valid = ranking_inputs(workdir / "ranking_valid.parquet", workflow.schema)
    dlrm = build_dlrm(workflow, valid["dense"].shape[1], config)
    dlrm.load_state_dict(torch.load(workdir / "models" / "dlrm.pt", weights_only=True))
    dlrm.eval()
    tables = model_dir / "embeddings"
    tables.mkdir()
    weights = dlrm.table_weights()
    sparse_columns = workflow.schema.sparse_columns
    for column, weight in zip(sparse_columns, weights, strict=True):
        np.save(tables / f"{column}.npy", weight.detach().numpy().astype(np.float32))
    (tables / "tables.json").write_text(
        json.dumps(
            {
                "columns": list(sparse_columns),
                "dim": config.dlrm_dim,
                "rows": {c: int(w.shape[0]) for c, w in zip(sparse_columns, weights, strict=True)},
            },
            indent=2,
        )
    )
    with torch.no_grad():
        embedded = dlrm.embed(torch.from_numpy(valid["sparse"][:64])).numpy()
    difference = export_dlrm_dense(
        dlrm.dense_part, valid["dense"], embedded, model_dir / "dlrm_dense.onnx"
    )
    shutil.copy(workdir / "models" / "gbm.txt", model_dir / "gbm.txt")
    ranking = json.loads((workdir / "ranking_result.json").read_text())
    (model_dir / "blend.json").write_text(
        json.dumps(
            {
                "dlrm_weight": ranking["blend_weight"],
                "tree_categorical": list(tree_categorical(workflow)),
                "sparse_columns": list(sparse_columns),
                PARTS: triton_parts(config.triton_target),
            },
            indent=2,
        )
    )
    picked = categorical_positions(sparse_columns, tree_categorical(workflow))
    sample = {"sparse": valid["sparse"][:4096], "dense": valid["dense"][:4096]}
    return difference, tree_features(sample, picked)[0]


def _write_drift_reference(
    release: Path,
    workdir: Path,
    workflow: Workflow,
    config: TrainConfig,
    query: ServedQuery | EnsembleQuery,
    index: Any,
    item_ids: np.ndarray,
) -> None:
    """``drift_reference.json``: the monitored quantities' bins from a replay of serving-like
    requests through this version's trained models (see ``drift_reference``)."""
    valid = ranking_inputs(workdir / "ranking_valid.parquet", workflow.schema)
    dlrm = build_dlrm(workflow, valid["dense"].shape[1], config)
    dlrm.load_state_dict(torch.load(workdir / "models" / "dlrm.pt", weights_only=True))
    dlrm.eval()
    query.eval()
    tree = TreeRanker.load(workdir / "models" / "gbm.txt")
    picked = categorical_positions(workflow.schema.sparse_columns, tree_categorical(workflow))
    weight = float(json.loads((workdir / "ranking_result.json").read_text())["blend_weight"])

    @torch.no_grad()
    def encode(features: np.ndarray, history: np.ndarray) -> np.ndarray:
        return query(torch.from_numpy(features), torch.from_numpy(history)).numpy()

    @torch.no_grad()
    def rank(sparse: np.ndarray, dense: np.ndarray) -> np.ndarray:
        step = 65_536
        logits = [
            dlrm(torch.from_numpy(sparse[i : i + step]), torch.from_numpy(dense[i : i + step]))
            .float()
            .numpy()
            .reshape(-1)
            for i in range(0, len(sparse), step)
        ]
        tree_logits = tree.logits(tree_features({"sparse": sparse, "dense": dense}, picked)[0])
        return weight * np.concatenate([*logits, np.zeros(0, np.float32)]) + (
            1 - weight
        ) * np.asarray(tree_logits).reshape(-1)

    references, method = replay_reference(
        workdir / "online",
        workflow,
        item_ids,
        encode,
        index.search,
        rank,
        config.history_length,
        int(time.time()),
        seed=config.seed,
    )
    write_reference(release / REFERENCE_FILE, references, method)


def item_table_info(workdir: Path, info: dict[str, Any]) -> dict[str, Any]:
    """How a catalog update reads an item table for this version (``item_table`` in the
    manifest): the key column and each multi-categorical feature's separator, as the data
    set's dataset file declares them; ``item_id`` for the built-in data sets."""
    found = {"key": "item_id", "separators": {}}
    ingested = workdir / "data" / "ingest.json"
    source = info.get("source")
    if not (isinstance(source, str) and source.endswith((".yaml", ".yml"))) and ingested.is_file():
        source = json.loads(ingested.read_text()).get("dataset_file")
    if not isinstance(source, str) or not Path(source).is_file():
        return found
    try:
        spec = load_dataset_file(Path(source)).spec
    except CascadeError:  # changed since training: the update's --key says it then
        return found
    if spec.items is None:
        return {**found, "key": spec.interactions.item}
    separators = {n: f.separator for n, f in spec.items.features.items() if f.separator}
    return {"key": spec.items.key, "separators": separators, "delimiter": spec.items.delimiter}


def run_export(workdir: Path, root: Path, config: TrainConfig, info: dict[str, Any]) -> Path:
    """Write a new version under ``root``; return its manifest path. Never overwrites."""
    workflow = Workflow.load(workdir / "workflow")
    data = RetrievalData.load(workdir / "retrieval.npz")
    writer = VersionWriter(root)
    version = writer.claim()
    try:
        two_tower = build_two_tower(workflow, data.item_dense.shape[1], config)
        two_tower.load_state_dict(
            torch.load(workdir / "models" / "two_tower.pt", weights_only=True)
        )
        staged = writer.staging(QUERY_TOWER)
        query_difference = export_query_tower(
            two_tower.served_query(), data.user_features, data.history, staged / "model.onnx"
        )
        _add_triton_files(root, QUERY_TOWER, staged)
        writer.publish(QUERY_TOWER, staged)
        assert writer.release is not None
        item_difference = export_item_tower(
            two_tower, data.item_features, data.item_dense, writer.release / ITEM_TOWER
        )

        staged = writer.staging(RANKER)
        dlrm_difference, tree_rows = _write_ranker(staged, workdir, workflow, config)
        _add_triton_files(root, RANKER, staged)
        ranker = writer.publish(RANKER, staged)
        parts = triton_parts(config.triton_target)
        fil = (
            {
                "fil_max_abs_difference": export_gpu_parts(
                    ranker, writer, config.triton_target, tree_rows
                )
            }
            if parts
            else {}
        )

        release = writer.release
        assert release is not None
        embeddings = np.load(workdir / "models" / "item_embeddings.npy")
        index = build_index(embeddings, seed=config.seed)
        save_index(index, release / "item_index.faiss")
        np.save(release / "item_embeddings.npy", embeddings)
        if (workdir / "models" / NEIGHBORS).is_dir():  # a work directory of an older version
            shutil.copytree(workdir / "models" / NEIGHBORS, release / NEIGHBORS)
        np.save(release / "item_ids.npy", data.item_ids)
        counts = np.load(workdir / "models" / "popularity.npy")
        order = np.argsort(-counts, kind="stable")
        (release / "popularity.json").write_text(
            json.dumps(
                {
                    "item_ids": data.item_ids[order].tolist(),
                    "counts": counts[order].tolist(),
                }
            )
        )
        shutil.copytree(workdir / "workflow", release / "workflow")
        shutil.copytree(workdir / "online", release / "online")
        _write_drift_reference(
            release, workdir, workflow, config, two_tower.served_query(), index, data.item_ids
        )
        return writer.finish(
            {
                **info,
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "models": {QUERY_TOWER: version, RANKER: version}
                | {name: version for name in parts.values()},
                "index": {
                    "kind": index_kind(index),
                    "items": int(index.ntotal),
                    "dim": int(index.d),
                },
                "item_table": item_table_info(workdir, info),
                "onnx_max_abs_difference": {
                    QUERY_TOWER: query_difference,
                    "item_tower": item_difference,
                    "dlrm_dense": dlrm_difference,
                },
                **fil,
                "config": config.model_dump(),
            }
        )
    except BaseException:
        writer.abandon()
        raise
