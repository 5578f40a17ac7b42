"""Benchmark: what an ensemble of two-towers costs at serving time, against one two-tower.

An ensemble (``--two-tower-ensemble K``) is served as one two-tower whose vectors are the
members' side by side: the query tower runs K towers and the ANN searches K times wider
vectors. This exports the served query tower of one member and of a K-member ensemble to
ONNX (the project's exporter), runs each on onnxruntime with one thread at batch 1 (what a
request costs), builds the project's item index (``build_index``: flat up to 100k items,
IVF above) over item vectors of each width and times a search for serving's 300
candidates, and prints the ensemble's cost as a ratio to the single tower's measured in the
same run. Untrained weights: the cost depends on the shapes only.

    python bench/ensemble_serving.py                       # MovieLens-sized, K = 3
    python bench/ensemble_serving.py --members 2 --hidden 128 --dim 64   # the default sizes
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import onnxruntime as ort
import torch
from publish import publish

from core.export.item_index import build_index, index_kind
from pipelines.export.onnx_models import export_query_tower
from pipelines.models.two_tower import ItemTower, QueryTower, TwoTower
from pipelines.models.two_tower_ensemble import TwoTowerEnsemble

USER_CARDINALITIES = [944, 3, 22, 8]  # MovieLens-100K's user id, gender, occupation, age
CANDIDATES = 300  # serving's retrieval budget


def member(items: int, hidden: int, dim: int) -> TwoTower:
    query = QueryTower(USER_CARDINALITIES, n_items=items + 2, hidden=hidden, out_dim=dim)
    item = ItemTower([items + 2], n_dense=3, hidden=hidden, out_dim=dim, bias=True)
    return TwoTower(query, item)


def per_call_us(call: Any, repeats: int) -> float:
    """Median over 5 rounds of the mean time of one call, in microseconds."""
    for _ in range(min(repeats, 50)):  # warm-up
        call()
    rounds = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(repeats):
            call()
        rounds.append((time.perf_counter() - started) / repeats * 1e6)
    return float(np.median(rounds))


def measure(model: TwoTower | TwoTowerEnsemble, items: int, repeats: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    features = np.stack([rng.integers(0, c, 64) for c in USER_CARDINALITIES], axis=1)
    history = rng.integers(1, items + 2, (64, 20))
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "model.onnx"
        export_query_tower(model.served_query(), features, history, path)
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        inputs = {"user_features": features[:1], "history": history[:1]}
        query = session.run(None, inputs)[0]
        query_us = per_call_us(lambda: session.run(None, inputs), repeats)
    vectors = rng.normal(size=(items, query.shape[1])).astype(np.float32)
    index = build_index(vectors, seed=0)
    search_us = per_call_us(lambda: index.search(query, CANDIDATES), repeats)
    return {
        "width": int(query.shape[1]),
        "index": index_kind(index),
        "query_tower_us": round(query_us, 1),
        "search_us": round(search_us, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--members", type=int, default=3, help="ensemble size K")
    parser.add_argument("--items", type=int, default=1682, help="catalog size")
    parser.add_argument("--hidden", type=int, default=1024, help="towers' hidden width")
    parser.add_argument("--dim", type=int, default=256, help="towers' output size")
    parser.add_argument("--repeats", type=int, default=500, help="calls per timing round")
    args = parser.parse_args()
    for option in ("members", "items", "hidden", "dim", "repeats"):
        if getattr(args, option) < (2 if option == "members" else 1):
            parser.error(f"--{option} is too small: {getattr(args, option)}")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    single = measure(member(args.items, args.hidden, args.dim), args.items, args.repeats)
    members = [member(args.items, args.hidden, args.dim) for _ in range(args.members)]
    ensemble = measure(TwoTowerEnsemble(members), args.items, args.repeats)
    ratios = {
        "query_tower": round(ensemble["query_tower_us"] / single["query_tower_us"], 2),
        "search": round(ensemble["search_us"] / single["search_us"], 2),
    }
    for name, row in (("one two-tower", single), (f"ensemble of {args.members}", ensemble)):
        print(
            f"{name:<16} width {row['width']:>5}  query tower {row['query_tower_us']:8.1f} us"
            f"  {row['index']} search@{CANDIDATES} {row['search_us']:8.1f} us"
        )
    print(f"ensemble / one: query tower {ratios['query_tower']}x, search {ratios['search']}x")
    publish(
        "ensemble_serving",
        {
            "benchmark": "ensemble_serving",
            "config": vars(args),
            "single": single,
            "ensemble": ensemble,
            "ratios": ratios,
        },
    )


if __name__ == "__main__":
    main()
