"""Benchmark: the per-request cost of drift counting on the gateway's request path.

Times ``DriftMonitor.observe_scored`` + ``observe_served`` (what every scored request pays)
on request-shaped arrays (300 candidates, the ranker's sparse and dense inputs, k = 10
served items, a 1M-item catalog), against a baseline measured in the same run: the ordering
stage's core for the same candidates (one argsort of the scores and the reordering of the
positions), an operation every request already pays. Prints a table, then one JSON object
as the last line.

    python bench/drift_overhead.py [--requests 20000] [--candidates 300] [--items 1000000]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from core.export.drift_reference import ITEM_QUANTITIES, USER_QUANTITIES, Reference
from core.features.schema import MOVIELENS
from services.drift.counting import DriftMonitor
from services.drift.window import VersionWindow
from services.serving.context import RequestContext
from services.settings import DriftSettings
from services.stores.base import UserRecord


def _per_call_us(function: object, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        function()  # type: ignore[operator]
    return (time.perf_counter() - started) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--candidates", type=int, default=300)
    parser.add_argument("--items", type=int, default=1_000_000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    references = {
        name: Reference.fit(rng.normal(size=5000), None, 10)
        for name in (*USER_QUANTITIES, *ITEM_QUANTITIES)
    }
    settings = DriftSettings()
    monitor = DriftMonitor(settings, Path("."), lambda: {}, seed=0)
    window = VersionWindow(
        references, rng.random(args.items), 20, settings.sub_windows, monitor.slot_s
    )
    monitor.windows[1] = window
    n = args.candidates
    ctx = RequestContext(user_id=1, k=10, timestamp=0, model_version=1)
    ctx.user = UserRecord(1, {}, np.arange(12), np.arange(30))
    ctx.candidates = rng.integers(0, args.items, n)
    ctx.retrieval_scores = rng.random(n).astype(np.float32)
    sparse = rng.integers(0, 50, (n, len(MOVIELENS.sparse_columns)))
    dense = rng.normal(size=(n, len(MOVIELENS.dense_inputs) + 18)).astype(np.float32)
    scores = rng.random(n).astype(np.float32)
    served = RequestContext(user_id=1, k=10, timestamp=0, model_version=1)
    served.candidates = ctx.candidates[:10]

    def drift() -> None:
        monitor.observe_scored(ctx, sparse, dense, scores)
        monitor.observe_served(served)

    def ordering() -> None:
        order = np.argsort(-scores, kind="stable")
        ctx.candidates[order][:10]

    for function in (drift, ordering):  # warm up
        _per_call_us(function, 200)
    drift_us = _per_call_us(drift, args.requests)
    baseline_us = _per_call_us(ordering, args.requests)
    memory_mb = (window.last_epoch.nbytes + window.percentiles.nbytes + window.counts.nbytes) / 1e6
    assert not monitor.failed
    print(f"{'what':<34} {'us/request':>10}")
    print(f"{'drift counting (scored + served)':<34} {drift_us:>10.1f}")
    print(f"{'baseline: ordering core':<34} {baseline_us:>10.1f}")
    print(
        f"ratio drift / baseline: {drift_us / baseline_us:.2f}; window memory per version "
        f"at {args.items:,} items: {memory_mb:.1f} MB"
    )
    print(
        json.dumps(
            {
                "drift_us_per_request": round(drift_us, 2),
                "baseline_us_per_request": round(baseline_us, 2),
                "ratio": round(drift_us / baseline_us, 3),
                "candidates": n,
                "items": args.items,
                "window_memory_mb": round(memory_mb, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
