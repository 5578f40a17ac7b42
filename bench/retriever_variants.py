"""Benchmark: two-tower variants against EASE on MovieLens-100K, both split protocols.

Issue 13 asks for a two-tower above every baseline on NDCG@10 under both protocols. This
trains each variant (``TrainConfig`` overrides: history length, widths, dropouts,
temperature...) and EASE on the same prepared splits, in parallel processes (one torch
thread each), and reports, per protocol, the mean over seeds of the kept epoch's validation
NDCG@10 (what model selection sees) and of test NDCG@10, and each variant's test NDCG@10 as
a ratio to EASE's measured in the same run (>= 1 means the variant beats EASE).

Prints a table, then one JSON object as its last line (also ``bench/results/
retriever_variants.json``). On 2 cores all the variants take about an hour (choose some with
``--variants``); on a machine with more cores, raise ``--workers``.

    python bench/retriever_variants.py                # seeds 0 1 2, both protocols
    python bench/retriever_variants.py --quick        # seed 0, global split, 3 epochs
    python bench/retriever_variants.py --variants default hidden512 --seeds 0
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from publish import publish

# TrainConfig overrides of each variant; "default" is the shipped configuration.
WIDE = {"two_tower_hidden": 1024, "two_tower_dim": 256}  # the widest that paid
IDS64 = {"two_tower_user_feature_dim": 32, "two_tower_item_feature_dim": 64}
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "no_item_bias": {"two_tower_item_bias": False},
    "hidden512": {"two_tower_hidden": 512},
    "history200": {"history_length": 200},
    "history200_wide": {
        "history_length": 200,
        "two_tower_history_dim": 128,
        "two_tower_hidden": 512,
        "user_id_dropout": 0.5,
    },
    "hidden512_dim256": {"two_tower_hidden": 512, "two_tower_dim": 256},
    "hidden512_dim256_t0.25": {"two_tower_hidden": 512, "two_tower_dim": 256, "temperature": 0.25},
    "hidden1024_dim256": WIDE,
    "hidden1024_dim512": {"two_tower_hidden": 1024, "two_tower_dim": 512},
    "hidden2048_dim512": {"two_tower_hidden": 2048, "two_tower_dim": 512},
    "hidden1024_dim256_ids64": {**WIDE, **IDS64},
    "hidden1024_dim256_ids128": {
        **WIDE,
        "two_tower_user_feature_dim": 64,
        "two_tower_item_feature_dim": 128,
    },
    "hidden1024_dim256_skip": {**WIDE, "two_tower_linear_skip": True},
    "hidden1024_dim256_ids64_skip": {**WIDE, **IDS64, "two_tower_linear_skip": True},
    "hidden1024_dim256_ensemble2": {**WIDE, "two_tower_ensemble": 2},
    "hidden1024_dim256_ensemble3": {**WIDE, "two_tower_ensemble": 3},
    "hidden1024_dim256_ids64_skip_epochs60": {
        **WIDE,
        **IDS64,
        "two_tower_linear_skip": True,
        "two_tower_epochs": 60,
    },
}
PROTOCOLS = ("global", "per_user")


def prepare_split(root: str, protocol: str, seed: int, history_length: int) -> str:
    """Prepare MovieLens-100K for one protocol, seed and history length; its directory."""
    from pipelines.config import TrainConfig
    from pipelines.data.movielens import load_movielens_100k
    from pipelines.pipeline import split_for
    from pipelines.prepare import prepare

    work = Path(root) / f"{protocol}-{seed}-h{history_length}"
    config = TrainConfig(split_protocol=protocol, seed=seed, history_length=history_length)
    raw = load_movielens_100k()
    prepare(raw, work, seed=seed, history_length=history_length, split=split_for(raw, config))
    return str(work)


def train_and_evaluate(work: str, variant: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """Train one variant (or EASE) on a prepared split; its validation and test NDCG@10."""
    import torch

    from core.features.workflow import Workflow
    from pipelines.config import TrainConfig
    from pipelines.evaluation.protocol import evaluate_split
    from pipelines.models.two_tower_ensemble import TwoTowerEnsemble
    from pipelines.prepare import RetrievalData
    from pipelines.training.baselines import train_ease
    from pipelines.training.loop import seed_everything
    from pipelines.training.retrieval import (
        build_two_tower,
        evaluate_two_tower,
        kept_record,
        retriever_validation,
        train_retriever,
        two_tower_scores,
    )

    torch.set_num_threads(1)
    config = TrainConfig(**overrides)
    seed_everything(config.seed)
    data = RetrievalData.load(Path(work) / "retrieval.npz")
    started = time.perf_counter()
    details: dict[str, Any] = {}  # a two-tower's kept epochs (and an ensemble's members)
    if variant == "ease":
        ease, _ = train_ease(data, config, lambda line: None)
        assert ease is not None  # MovieLens is far below the EASE catalog limit
        valid = evaluate_split(ease.scores, data, "valid", config.valid_users)
        test = evaluate_split(ease.scores, data, "test")
    else:
        model = build_two_tower(
            Workflow.load(Path(work) / "workflow"), data.item_dense.shape[1], config
        )
        curves = train_retriever(model, data, config, quiet=True)
        scores = two_tower_scores(model, data)
        valid = retriever_validation(curves, scores, data, config)
        test = evaluate_split(scores, data, "test")
        if isinstance(model, TwoTowerEnsemble):  # what each member alone would have given
            details["member_test_ndcg@10"] = [
                evaluate_two_tower(member, data)["ndcg@10"] for member in model.towers()
            ]
        details |= {
            "kept_epoch": [kept_record(curve)["epoch"] for curve in curves.values()],
            "epochs_run": [len(curve) for curve in curves.values()],
        }
    return {
        "variant": variant,
        "protocol": config.split_protocol,
        "seed": config.seed,
        "valid_ndcg@10": valid["ndcg@10"],
        "test_ndcg@10": test["ndcg@10"],
        **details,
        "seconds": round(time.perf_counter() - started, 1),
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per protocol and variant: means over seeds, test spread, ratio to EASE's test mean."""
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for protocol in sorted({r["protocol"] for r in runs}):
        mine = [r for r in runs if r["protocol"] == protocol]
        rows: dict[str, dict[str, float]] = {}
        for variant in dict.fromkeys(r["variant"] for r in mine):
            test = [r["test_ndcg@10"] for r in mine if r["variant"] == variant]
            valid = [r["valid_ndcg@10"] for r in mine if r["variant"] == variant]
            rows[variant] = {
                "seeds": len(test),
                "valid_ndcg@10": round(statistics.mean(valid), 4),
                "test_ndcg@10": round(statistics.mean(test), 4),
                "test_std": round(statistics.stdev(test), 4) if len(test) > 1 else 0.0,
            }
            members = [
                value
                for r in mine
                if r["variant"] == variant
                for value in r.get("member_test_ndcg@10", [])
            ]
            if members:  # an ensemble: its members' mean alone, over seeds and members
                rows[variant]["member_test_ndcg@10"] = round(statistics.mean(members), 4)
        ease = rows["ease"]["test_ndcg@10"]
        for row in rows.values():
            row["test_over_ease"] = round(row["test_ndcg@10"] / ease, 3)
            if "member_test_ndcg@10" in row:
                row["member_test_over_ease"] = round(row["member_test_ndcg@10"] / ease, 3)
        summary[protocol] = rows
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=sorted(VARIANTS),
        default=list(VARIANTS),
        help="variants to train (default: all)",
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="split seeds")
    parser.add_argument(
        "--protocols", nargs="+", choices=PROTOCOLS, default=list(PROTOCOLS), help="split protocols"
    )
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="parallel training processes"
    )
    parser.add_argument("--quick", action="store_true", help="seed 0, global, 3 epochs")
    args = parser.parse_args()
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    extra: dict[str, Any] = {}
    if args.quick:
        args.seeds, args.protocols, extra = [0], ["global"], {"two_tower_epochs": 3}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as root, ProcessPoolExecutor(args.workers) as pool:
        lengths = sorted({VARIANTS[v].get("history_length", 20) for v in args.variants} | {20})
        splits = [(p, s) for p in args.protocols for s in args.seeds]
        prepared = {
            (p, s, h): pool.submit(prepare_split, root, p, s, h) for p, s in splits for h in lengths
        }
        works = {key: future.result() for key, future in prepared.items()}
        jobs = []
        for protocol, seed in splits:
            base = {"split_protocol": protocol, "seed": seed}
            jobs.append(pool.submit(train_and_evaluate, works[(protocol, seed, 20)], "ease", base))
            for variant in args.variants:
                overrides = {**base, **extra, **VARIANTS[variant]}
                work = works[(protocol, seed, overrides.get("history_length", 20))]
                jobs.append(pool.submit(train_and_evaluate, work, variant, overrides))
        runs = [job.result() for job in jobs]
    summary = summarise(runs)
    for protocol, rows in summary.items():
        print(f"{protocol} split")
        for variant, row in rows.items():
            print(
                f"  {variant:<16} valid {row['valid_ndcg@10']:.4f}  test {row['test_ndcg@10']:.4f}"
                f" ± {row['test_std']:.4f}  test/EASE {row['test_over_ease']:.3f}"
                f"  ({row['seeds']} seeds)"
            )
            if "member_test_over_ease" in row:
                print(f"  {'':<16} its members alone: test/EASE {row['member_test_over_ease']:.3f}")
    record = {
        "benchmark": "retriever_variants",
        "seeds": args.seeds,
        "variants": {v: VARIANTS[v] for v in args.variants},
        "extra": extra,
        "summary": summary,
        "runs": runs,
        "seconds": round(time.perf_counter() - started, 1),
    }
    publish("retriever_variants", record)


if __name__ == "__main__":
    main()
