"""Score an exported version on the gate's holdout through the serving code.

Candidate and production are both read from the export root exactly as a gateway reads them
(``load_release`` verifies every file's sha256, ``QueryTowerModel`` and ``RankingModel`` run
the ONNX models, the LightGBM model and the blend), so the gate judges what would be served,
and the two versions go through the same code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from control.validation.holdout import EvalSet, Holdout
from core.features.rows import AttributeTable, join_rows
from core.features.spec import dense_block
from pipelines.evaluation.metrics import per_user_retrieval

SCORES_PER_BATCH = 1 << 25  # users x items scored at once (128 MB of float32)


@dataclass
class Scored:
    """One version's outputs on the eval set."""

    retrieval: dict[str, np.ndarray]  # metric -> per user (EvalSet.users order)
    tail: dict[str, np.ndarray]  # the same on long-tail positives only (users with some)
    logits: np.ndarray  # per ranking row
    queries: np.ndarray  # query embeddings per user


class ExportedVersion:
    """A version of the export root, loaded with the serving side's loaders."""

    def __init__(self, root: Path, version: int) -> None:
        self.root, self.version = root, version

    def load(self) -> None:
        from services.inference.embeddings import InMemoryTables
        from services.inference.models import QueryTowerModel, RankingModel
        from services.serving.release import load_release

        self.release = load_release(self.root, self.version)
        models = self.root / "model_repository"
        self.query = QueryTowerModel(models / "query_tower" / str(self.version))
        self.query.load()
        ranker_dir = models / "ranker" / str(self.version)
        self.ranker = RankingModel(
            ranker_dir, embeddings=InMemoryTables.load(ranker_dir / "embeddings")
        )
        self.ranker.load()
        directory = self.root / "releases" / str(self.version)
        self.item_embeddings = np.load(directory / "item_embeddings.npy")
        self.history_length = int(self.release.manifest["config"]["history_length"])

    def close(self) -> None:
        self.ranker.close()

    def query_inputs(self, holdout: Holdout, evals: EvalSet) -> tuple[np.ndarray, np.ndarray]:
        """User id-features and left-padded history (item_id_idx) of every eval user."""
        workflow = self.release.workflow
        schema = workflow.schema
        users = AttributeTable(holdout.users, "user_id", schema.user_attributes)
        raw = {"user_id": evals.users, **users.lookup(evals.users)}
        encoded = workflow.transform(raw, partial=True)
        tower = schema.user_tower_columns
        features = np.stack([encoded[c] for c in tower], axis=1).astype(np.int64)
        length = self.history_length
        history = np.zeros((len(evals.users), length), dtype=np.int64)
        recent = [h[-length:] for h in evals.history]
        flat = np.concatenate([*recent, np.zeros(0, np.int64)]).astype(np.int64)
        if len(flat):
            ids = workflow.transform({"item_id": flat}, partial=True)["item_id_idx"]
            lengths = np.asarray([len(r) for r in recent])
            rows = np.repeat(np.arange(len(recent)), lengths)
            columns = np.concatenate([np.arange(length - n, length) for n in lengths])
            history[rows, columns] = ids
        return features, history

    def ranking_inputs(self, holdout: Holdout, evals: EvalSet) -> tuple[np.ndarray, np.ndarray]:
        rows = evals.rank_rows
        schema = self.release.workflow.schema
        columns = join_rows(
            AttributeTable(holdout.users, "user_id", schema.user_attributes),
            AttributeTable(holdout.items, "item_id", schema.item_attributes),
            rows["user_id"].to_numpy(),
            rows["item_id"].to_numpy(),
            rows["timestamp"].to_numpy(),
        )
        encoded = self.release.workflow.transform(columns)
        sparse = np.stack([encoded[c] for c in schema.sparse_columns], axis=1).astype(np.int64)
        return sparse, dense_block(encoded, schema)

    def score(self, holdout: Holdout, evals: EvalSet) -> Scored:
        features, history = self.query_inputs(holdout, evals)
        queries = np.concatenate(
            [
                self.query.encode(features[i : i + 1024], history[i : i + 1024])
                for i in range(0, max(len(features), 1), 1024)
            ]
        )[: len(features)]
        positions = self.release.positions

        def to_positions(items: list[np.ndarray]) -> list[np.ndarray]:
            out = [positions(np.asarray(i, np.int64)) for i in items]
            return [p[p >= 0] for p in out]

        local = np.arange(len(evals.users))
        relevant = np.asarray([len(t) for t in evals.truth])
        batch = max(1, SCORES_PER_BATCH // max(len(self.item_embeddings), 1))

        def scores(users: np.ndarray) -> np.ndarray:
            return queries[users] @ self.item_embeddings.T

        seen = to_positions(evals.seen)
        retrieval = (
            per_user_retrieval(
                scores, local, to_positions(evals.truth), seen, batch=batch, relevant=relevant
            )
            if len(local)
            else {}
        )
        tail_users = local[evals.user_slices["long_tail_items"]] if len(local) else local
        tail_relevant = np.asarray([len(t) for t in evals.tail_truth])
        tail = (
            per_user_retrieval(
                scores,
                tail_users,
                to_positions(evals.tail_truth),
                seen,
                batch=batch,
                relevant=tail_relevant,
            )
            if len(tail_users)
            else {}
        )
        sparse, dense = self.ranking_inputs(holdout, evals)
        logits, _ = (
            self.ranker.score(sparse, dense) if len(sparse) else (np.zeros(0, np.float32), False)
        )
        return Scored(retrieval, tail, np.asarray(logits, np.float64), queries)
