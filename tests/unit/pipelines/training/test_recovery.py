"""The two-tower recovers the synthetic generator's latent preferences (a small, fast version
of the scale runs in bench/): on held-out picks it beats popularity by a clear margin."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.features.workflow import Workflow
from pipelines.config import TrainConfig
from pipelines.data.synthetic import make_synthetic
from pipelines.evaluation.protocol import evaluate_split
from pipelines.prepare import RetrievalData, prepare
from pipelines.training.baselines import popularity_scores
from pipelines.training.loop import seed_everything
from pipelines.training.retrieval import build_two_tower, evaluate_two_tower, train_retriever


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("recovery")
    prepare(make_synthetic(800, 500, 40_000, seed=5), work, seed=5)
    return work


def test_two_tower_beats_popularity_by_a_clear_margin(prepared: Path) -> None:
    config = TrainConfig(seed=5, two_tower_epochs=8, patience=3)
    seed_everything(config.seed)
    data = RetrievalData.load(prepared / "retrieval.npz")
    model = build_two_tower(Workflow.load(prepared / "workflow"), data.item_dense.shape[1], config)
    curve = train_retriever(model, data, config, quiet=True)["two_tower"]
    assert any(r.get("best") for r in curve)
    two_tower = evaluate_two_tower(model, data, "test")
    popularity = evaluate_split(popularity_scores(data), data, "test")
    assert two_tower["ndcg@10"] > 1.3 * popularity["ndcg@10"], (two_tower, popularity)
    assert two_tower["recall@10"] > 1.2 * popularity["recall@10"], (two_tower, popularity)


def test_without_preferences_there_is_little_to_recover(prepared: Path, tmp_path: Path) -> None:
    """The control: picks by popularity alone leave popularity near the best possible."""
    prepare(make_synthetic(800, 500, 40_000, seed=5, preference_strength=0.0), tmp_path, seed=5)
    config = TrainConfig(seed=5, two_tower_epochs=8, patience=3)
    seed_everything(config.seed)
    data = RetrievalData.load(tmp_path / "retrieval.npz")
    model = build_two_tower(Workflow.load(tmp_path / "workflow"), data.item_dense.shape[1], config)
    train_retriever(model, data, config, quiet=True)
    two_tower = evaluate_two_tower(model, data, "test")
    popularity = evaluate_split(popularity_scores(data), data, "test")
    assert two_tower["ndcg@10"] < 1.25 * popularity["ndcg@10"], (two_tower, popularity)
