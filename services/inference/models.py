"""The two served models as importable code: used in process by the gateway and, unchanged,
by the thin Triton python-backend ``model.py`` files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort

from pipelines.errors import ArtifactError
from pipelines.models.gbm import TreeRanker, tree_features
from services.inference.embeddings import EmbeddingLookup, InMemoryTables


def _session(path: Path, threads: int = 1) -> ort.InferenceSession:
    if not path.is_file():
        raise ArtifactError(f"{path} is missing")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class QueryTowerModel:
    """User id-features + history item ids -> unit-norm query embedding."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.session: ort.InferenceSession | None = None

    def load(self) -> None:
        self.session = _session(self.directory / "model.onnx")

    def encode(self, user_features: np.ndarray, history: np.ndarray) -> np.ndarray:
        assert self.session is not None, "load first"
        feeds = {
            "user_features": user_features.astype(np.int64),
            "history": history.astype(np.int64),
        }
        return self.session.run(None, feeds)[0]


def embeddings_for(directory: Path) -> EmbeddingLookup:
    """The ranker's embedding rows as configured: the hierarchical cache when
    ``CASCADE_EMBEDDING_CACHE__REDIS_URL`` is set, else the whole tables in memory. (Opt-in
    for now: inside Triton's python backend the cache costs ~3 ms per ranker call, see
    bench/serving.py --embedding-cache.)"""
    from services.settings import Settings

    settings = Settings().embedding_cache
    url = settings.redis_url
    if not url:
        return InMemoryTables.load(directory / "embeddings")
    from services.embedding_cache.backing import RedisRows
    from services.embedding_cache.cache import CacheConfig, HierarchicalEmbeddingCache

    spec = json.loads((directory / "embeddings" / "tables.json").read_text())
    return HierarchicalEmbeddingCache(
        RedisRows(url, settings.namespace, settings.timeout_ms / 1000),
        version=int(directory.name),
        tables={c: int(spec["rows"][c]) for c in spec["columns"]},
        dim=int(spec["dim"]),
        config=CacheConfig(
            settings.device_capacity,
            settings.host_capacity,
            settings.policy,
            settings.async_threshold,
        ),
    )


class RankingModel:
    """DLRM (embedding lookup + ONNX dense part) and LightGBM, blended on the logit scale."""

    def __init__(self, directory: Path, embeddings: EmbeddingLookup | None = None) -> None:
        self.directory = directory
        self.embeddings = embeddings
        self.session: ort.InferenceSession | None = None
        self.tree: TreeRanker | None = None
        self.dlrm_weight = 0.5

    def load(self) -> None:
        blend_path = self.directory / "blend.json"
        if not blend_path.is_file():
            raise ArtifactError(f"{blend_path} is missing")
        self.dlrm_weight = float(json.loads(blend_path.read_text())["dlrm_weight"])
        self.session = _session(self.directory / "dlrm_dense.onnx")
        self.tree = TreeRanker.load(self.directory / "gbm.txt")
        if self.embeddings is None:
            self.embeddings = embeddings_for(self.directory)

    def score(self, sparse: np.ndarray, dense: np.ndarray) -> tuple[np.ndarray, bool]:
        """``sparse [N, T]`` int64, ``dense [N, D]`` float32 -> blended logits ``[N]`` float32,
        and whether embedding rows were degraded (default rows served for a failed store)."""
        assert self.session is not None and self.tree is not None and self.embeddings is not None
        if len(sparse) == 0:
            return np.zeros(0, dtype=np.float32), False
        embedded = self.embeddings.lookup(sparse)
        dlrm = self.session.run(None, {"dense": dense.astype(np.float32), "embedded": embedded})[0]
        tree = self.tree.logits(tree_features({"sparse": sparse, "dense": dense})[0])
        scores = (self.dlrm_weight * dlrm + (1 - self.dlrm_weight) * tree).astype(np.float32)
        return scores, self.embeddings.degraded
