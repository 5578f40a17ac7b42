"""The two served models as importable code: used in process by the gateway and, unchanged,
by the thin Triton python-backend ``model.py`` files."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import onnxruntime as ort

from core.errors import ArtifactError
from core.export.triton_gpu_configs import PARTS
from core.export.verify import verify_model_directory
from core.redact import redact_url
from core.tree_ranker import TreeRanker, categorical_positions, tree_features
from services.inference.embeddings import (
    EmbeddingLookup,
    InMemoryTables,
    TableSpec,
    read_table_spec,
)

if TYPE_CHECKING:
    from services.settings import Settings

log = logging.getLogger(__name__)


def _session(path: Path, threads: int = 1) -> ort.InferenceSession:
    if not path.is_file():
        raise ArtifactError(f"{path} is missing")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class QueryTowerModel:
    """User id-features + history item ids -> query embedding (the two-tower's unit vector, then
    a constant 1 when the model has an item bias: see ``pipelines.models.two_tower``)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.session: ort.InferenceSession | None = None

    def load(self) -> None:
        """Verify the version directory against its manifest, then open the ONNX model."""
        verify_model_directory(self.directory)
        self.session = _session(self.directory / "model.onnx")

    def encode(self, user_features: np.ndarray, history: np.ndarray) -> np.ndarray:
        assert self.session is not None, "load first"
        feeds = {
            "user_features": user_features.astype(np.int64),
            "history": history.astype(np.int64),
        }
        return self.session.run(None, feeds)[0]


def tables_mib(spec: TableSpec) -> float:
    """Memory of all the tables' rows as float32, in MiB."""
    return sum(spec.rows.values()) * spec.dim * 4 / 2**20


def embeddings_for(directory: Path, settings: Settings | None = None) -> EmbeddingLookup:
    """The ranker's embedding rows: the whole tables in memory when they fit the configured
    budget (``embedding_cache.in_memory_max_mb``: a plain array lookup costs far less than
    the cache's tiers), when the cache is disabled or no Redis is configured; else the
    hierarchical cache.

    Raises ``ArtifactError`` when Redis answers but does not hold every row of this model
    version (run ``cascade materialize``). When Redis does not answer, the cache is still
    built: it serves default rows, flagged degraded, until Redis is back.
    """
    from services.settings import Settings

    settings = settings or Settings()
    config = settings.embedding_cache
    url = config.redis_url or settings.redis.url
    spec = read_table_spec(directory / "embeddings")
    if not config.enabled or not url or tables_mib(spec) <= config.in_memory_max_mb:
        if config.enabled and url:
            log.info(
                "embedding rows of %s: %.1f MiB fit embedding_cache.in_memory_max_mb (%g): "
                "served from memory, not through the cache",
                directory,
                tables_mib(spec),
                config.in_memory_max_mb,
            )
        return InMemoryTables.load(directory / "embeddings")
    import redis

    from services.embedding_cache.backing import RedisRows
    from services.embedding_cache.cache import CacheConfig, HierarchicalEmbeddingCache

    version = int(directory.name)
    backing = RedisRows(url, config.namespace, config.timeout_ms / 1000)
    try:
        stored = backing.stored_tables(version)
    except redis.RedisError as error:
        log.warning(
            "cannot check the embedding rows of model version %d in %s (%s); serving through "
            "the cache, degraded until Redis answers",
            version,
            redact_url(url),
            error,
        )
    else:
        if stored != {"tables": spec.rows, "dim": spec.dim}:
            raise ArtifactError(
                f"Redis at {redact_url(url)} (namespace {config.namespace!r}) does not hold the "
                f"embedding rows of model version {version}: run `cascade materialize`"
            )
    import torch

    # The cache's CPU gathers are a few thousand rows: torch's intra-op pool does not speed
    # them up, and its spinning workers steal cores from the rest of the serving process
    # (docs/benchmarks/code-notes.md).
    torch.set_num_threads(1)
    return HierarchicalEmbeddingCache(
        backing,
        version=version,
        tables=spec.rows,
        dim=spec.dim,
        config=CacheConfig.from_settings(config),
    )


class RankerParts(Protocol):
    """The ranker's two learnt parts run elsewhere (on Triton's FIL and ONNX Runtime
    backends, for the GPU target: ``services.inference.triton_python.TritonParts``)."""

    def dense_logits(self, dense: np.ndarray, embedded: np.ndarray) -> np.ndarray: ...

    def tree_logits(self, features: np.ndarray) -> np.ndarray: ...


class RankingModel:
    """DLRM (embedding lookup + ONNX dense part) and LightGBM, blended on the logit scale."""

    def __init__(
        self,
        directory: Path,
        embeddings: EmbeddingLookup | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.directory = directory
        self.embeddings = embeddings
        self.settings = settings  # None: read from the environment (the Triton stub)
        # None: both parts run here; set by the Triton stub of a GPU-target version
        self.parts: RankerParts | None = None
        self.triton_parts: dict[str, str] = {}  # blend.json's: the models a GPU target calls
        self.session: ort.InferenceSession | None = None
        self.tree: TreeRanker | None = None
        self.dlrm_weight = 0.5
        self.tree_columns: list[int] = []  # the tree's categorical columns in ``sparse``
        self.tables = 0  # sparse columns (one embedding table each), known after load()
        self.dense_width = 0

    def load(self) -> None:
        """Verify the version directory against its manifest (dense part, tree, tables and
        specs), then load them; ``ArtifactError`` names a missing or corrupted file."""
        verify_model_directory(self.directory)
        blend_path = self.directory / "blend.json"
        if not blend_path.is_file():
            raise ArtifactError(f"{blend_path} is missing")
        blend = json.loads(blend_path.read_text())
        self.dlrm_weight = float(blend["dlrm_weight"])
        self.triton_parts = dict(blend.get(PARTS) or {})
        self.tree_columns = categorical_positions(
            blend["sparse_columns"], blend["tree_categorical"]
        )
        self.session = _session(self.directory / "dlrm_dense.onnx")
        shapes = {i.name: i.shape for i in self.session.get_inputs()}
        self.tables, self.dense_width = int(shapes["embedded"][1]), int(shapes["dense"][1])
        self.tree = TreeRanker.load(self.directory / "gbm.txt")
        if self.embeddings is None:
            self.embeddings = embeddings_for(self.directory, self.settings)

    def close(self) -> None:
        if self.embeddings is not None:
            self.embeddings.close()

    def check_inputs(self, sparse: np.ndarray, dense: np.ndarray) -> None:
        """Raise ``ValueError`` naming what is wrong unless ``sparse`` is ``[N, tables]``
        integers and ``dense`` is ``[N, dense_width]`` numbers."""
        if sparse.ndim != 2 or sparse.shape[1] != self.tables:
            raise ValueError(f"sparse must be [N, {self.tables}], got {list(sparse.shape)}")
        if dense.ndim != 2 or dense.shape[1] != self.dense_width:
            raise ValueError(f"dense must be [N, {self.dense_width}], got {list(dense.shape)}")
        if len(sparse) != len(dense):
            raise ValueError(f"sparse has {len(sparse)} rows but dense has {len(dense)}")
        if not np.issubdtype(sparse.dtype, np.integer):
            raise ValueError(f"sparse must hold integer ids, got {sparse.dtype}")

    def score(self, sparse: np.ndarray, dense: np.ndarray) -> tuple[np.ndarray, bool]:
        """``sparse [N, T]`` int64, ``dense [N, D]`` float32 -> blended logits ``[N]`` float32,
        and whether embedding rows were degraded (default rows served for a failed store)."""
        assert self.session is not None and self.tree is not None and self.embeddings is not None
        if len(sparse) == 0:
            return np.zeros(0, dtype=np.float32), False
        embedded = self.embeddings.lookup(sparse)
        dense = dense.astype(np.float32)
        features = tree_features({"sparse": sparse, "dense": dense}, self.tree_columns)[0]
        if self.parts is None:
            dlrm = self.session.run(None, {"dense": dense, "embedded": embedded})[0].reshape(-1)
            tree = self.tree.logits(features)
        else:
            dlrm = self.parts.dense_logits(dense, embedded).reshape(-1)
            tree = self.parts.tree_logits(features).reshape(-1)
        scores = (self.dlrm_weight * dlrm + (1 - self.dlrm_weight) * tree).astype(np.float32)
        return scores, self.embeddings.degraded
