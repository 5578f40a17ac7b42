"""Checks of a candidate that need no comparison: finite, varied scores; ONNX equal to
torch on holdout inputs; the ANN index against exact search; a smoke request through the
gateway's own code."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import torch

from control.validation.scoring import ExportedVersion
from core.features.workflow import Workflow
from pipelines.config import TrainConfig

ANN_K = 100


def score_spread(values: np.ndarray) -> tuple[bool, float, str]:
    """(finite, std, detail) of a score array."""
    values = np.asarray(values, dtype=np.float64)
    finite = bool(np.isfinite(values).all()) and len(values) > 0
    std = float(np.std(values)) if finite else float("nan")
    bad = int((~np.isfinite(values)).sum())
    return finite, std, f"{len(values)} scores, {bad} not finite, std {std:.3g}"


def onnx_difference(
    version: ExportedVersion,
    workdir: Path,
    config: TrainConfig,
    features: np.ndarray,
    history: np.ndarray,
    sparse: np.ndarray,
    dense: np.ndarray,
) -> dict[str, float]:
    """Largest |ONNX - torch| of the query tower and of DLRM, on holdout inputs, torch models
    rebuilt from the training work directory."""
    from pipelines.training.ranking import build_dlrm
    from pipelines.training.retrieval import build_two_tower

    workflow = Workflow.load(workdir / "workflow")
    with np.load(workdir / "retrieval.npz") as data:
        n_item_dense = int(data["item_dense"].shape[1])
    two_tower = build_two_tower(workflow, n_item_dense, config)
    two_tower.load_state_dict(torch.load(workdir / "models" / "two_tower.pt", weights_only=True))
    two_tower.eval()
    dlrm = build_dlrm(workflow, dense.shape[1], config)
    dlrm.load_state_dict(torch.load(workdir / "models" / "dlrm.pt", weights_only=True))
    dlrm.eval()
    out = {}
    with torch.no_grad():
        query = two_tower.served_query()
        expected = query(torch.from_numpy(features), torch.from_numpy(history)).numpy()
        got = version.query.encode(features, history)
        out["query_tower"] = float(np.max(np.abs(got - expected))) if len(got) else 0.0
        torch_logits = dlrm(torch.from_numpy(sparse), torch.from_numpy(dense)).float().numpy()
    ranker = version.ranker
    assert ranker.session is not None and ranker.embeddings is not None
    embedded = ranker.embeddings.lookup(sparse)
    onnx_logits = ranker.session.run(None, {"dense": dense, "embedded": embedded})[0]
    out["dlrm"] = (
        float(np.max(np.abs(onnx_logits.reshape(-1) - torch_logits.reshape(-1))))
        if len(sparse)
        else 0.0
    )
    return out


def ann_recall(version: ExportedVersion, queries: np.ndarray, k: int = ANN_K) -> float:
    """Mean share of the exact top-k (inner product over the release's item embeddings)
    that the served index returns, for ``queries``."""
    if len(queries) == 0:
        return float("nan")
    k = min(k, len(version.item_embeddings))
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    exact_scores = queries @ version.item_embeddings.T
    exact = np.argpartition(-exact_scores, k - 1, axis=1)[:, :k]
    _, found = version.release.index.search(queries, k)
    hits = [len(np.intersect1d(a, b)) for a, b in zip(exact, found, strict=True)]
    return float(np.mean(hits) / k)


def smoke_request(root: Path, version: int, user_id: int, k: int = 10) -> tuple[bool, str]:
    """Start an embedded gateway pinned to ``version`` (in-memory store, in-process models)
    and ask for ``k`` items for ``user_id``: passes when it answers k distinct items with
    finite scores and no degradation."""
    from services.serving.gateway import Gateway
    from services.settings import (
        EmbeddingCacheSettings,
        RedisSettings,
        Settings,
        TritonSettings,
    )

    settings = Settings(
        artifacts=root,
        model_version=version,
        artifact_fallback=False,
        redis=RedisSettings(url=None),
        triton=TritonSettings(url=None),
        embedding_cache=EmbeddingCacheSettings(enabled=False),
        streams_dir=None,
    )

    async def ask() -> tuple[bool, str]:
        gateway = Gateway(settings)
        try:
            await gateway.start()
            ctx, _ = await gateway.recommend(user_id, k, {}, [], version)
        finally:
            await gateway.close()
        items = ctx.candidates[: ctx.k]
        scores = np.asarray(ctx.scores[: ctx.k], dtype=np.float64)
        ok = (
            len(items) == k
            and len(np.unique(items)) == k
            and bool(np.isfinite(scores).all())
            and not ctx.degraded
        )
        return ok, f"user {user_id}: {len(items)} items, reasons {ctx.reasons or 'none'}"

    try:
        return asyncio.run(ask())
    except Exception as error:  # the check reports any failure to load or answer
        return False, f"{type(error).__name__}: {error}"
