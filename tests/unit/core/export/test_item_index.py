from __future__ import annotations

from pathlib import Path

import numpy as np

from core.export import item_index
from core.export.item_index import build_index, index_kind, load_index, save_index


def _unit(n: int, dim: int = 16) -> np.ndarray:
    vectors = np.random.default_rng(0).normal(size=(n, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_small_catalog_gets_an_exact_flat_index(tmp_path: Path) -> None:
    vectors = _unit(500)
    index = build_index(vectors)
    assert index_kind(index) == "flat"
    save_index(index, tmp_path / "i.faiss")
    _, found = load_index(tmp_path / "i.faiss").search(vectors[:5], 1)
    assert found[:, 0].tolist() == [0, 1, 2, 3, 4]


def test_large_catalog_gets_ivf_with_high_recall(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(item_index, "FLAT_LIMIT", 1_000)
    vectors = _unit(20_000)
    index = build_index(vectors)
    assert index_kind(index) == "ivf_flat"
    queries = _unit(200, 16)[::-1].copy()
    exact = np.argsort(-(queries @ vectors.T), axis=1)[:, :10]
    _, approximate = index.search(queries, 10)
    recall = np.mean([len(set(a) & set(e)) / 10 for a, e in zip(approximate, exact, strict=True)])
    assert recall > 0.9
