"""The evaluation report: ``report.json`` plus PNG plots (training curves, metric tables)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _curves_plot(curves: dict[str, list[dict[str, float]]], path: Path) -> None:
    """One panel per model: losses on the left axis, validation metrics on the right."""
    figure, axes = plt.subplots(1, len(curves), figsize=(4.8 * len(curves), 3.5), squeeze=False)
    for axis, (name, records) in zip(axes[0], curves.items(), strict=True):
        if not records:
            continue
        x_key = "epoch" if "epoch" in records[0] else "round"
        x = [r[x_key] for r in records]
        keys = list(dict.fromkeys(k for r in records for k in r if k not in (x_key, "best")))
        losses = [k for k in keys if "loss" in k and not k.startswith("valid_")]
        metrics = [k for k in keys if k not in losses]
        for key in losses:
            axis.plot(x, [r.get(key, float("nan")) for r in records], label=key)
        axis.set_ylabel("loss")
        handles, labels = axis.get_legend_handles_labels()
        if metrics:
            right = axis.twinx()
            for key in metrics:  # validated epochs only (validation may skip epochs)
                points = [(r[x_key], r[key]) for r in records if key in r]
                right.plot(*zip(*points, strict=True), marker=".", label=key)
            right.set_ylabel("validation metric")
            more_handles, more_labels = right.get_legend_handles_labels()
            handles, labels = handles + more_handles, labels + more_labels
        axis.set_title(name)
        axis.set_xlabel(x_key)
        axis.legend(handles, labels, fontsize=8, loc="center right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _table_plot(title: str, metrics: dict[str, dict[str, float]], path: Path) -> None:
    models = list(metrics)
    columns = list(next(iter(metrics.values())))
    cells = [[f"{metrics[m][c]:.4f}" for c in columns] for m in models]
    figure, axis = plt.subplots(figsize=(1.6 * (len(columns) + 1), 0.45 * (len(models) + 2)))
    axis.axis("off")
    axis.set_title(title)
    table = axis.table(cellText=cells, rowLabels=models, colLabels=columns, loc="center")
    table.scale(1, 1.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def lift_over(metrics: dict[str, dict[str, float]], model: str, baseline: str) -> dict[str, float]:
    """``model / baseline`` for every metric (how far a model beats a baseline)."""
    return {
        k: metrics[model][k] / metrics[baseline][k] if metrics[baseline][k] else float("inf")
        for k in metrics[model]
    }


def write_report(
    directory: Path, retrieval: dict[str, Any], ranking: dict[str, Any], info: dict[str, Any]
) -> Path:
    """Write ``report.json`` and the plots into ``directory``; return the report's path."""
    directory.mkdir(parents=True, exist_ok=True)
    plots = {
        "retrieval_curves": "retrieval_curves.png",
        "ranking_curves": "ranking_curves.png",
        "retrieval_metrics": "retrieval_metrics.png",
        "ranking_metrics": "ranking_metrics.png",
    }
    _curves_plot(retrieval["curves"], directory / plots["retrieval_curves"])
    _curves_plot(ranking["curves"], directory / plots["ranking_curves"])
    _table_plot(
        "Retrieval (test, full ranking)",
        retrieval["metrics"],
        directory / plots["retrieval_metrics"],
    )
    _table_plot("Ranking (test)", ranking["metrics"], directory / plots["ranking_metrics"])
    metrics = retrieval["metrics"]
    baselines = [m for m in metrics if m != "two_tower"]
    report = {
        **info,
        "retrieval": {
            "metrics": metrics,
            "valid_metrics": retrieval.get("valid_metrics", {}),
            **{f"two_tower_over_{b}": lift_over(metrics, "two_tower", b) for b in baselines},
            "baselines": retrieval.get("baselines", {}),
            "candidate_sources": retrieval.get("candidate_sources", {}),
        },
        "ranking": {"metrics": ranking["metrics"], "blend_weight": ranking["blend_weight"]},
        "quality_checks": [
            r["popularity_check"] for r in (retrieval, ranking) if "popularity_check" in r
        ],
        "curves": {"retrieval": retrieval["curves"], "ranking": ranking["curves"]},
        "plots": plots,
    }
    path = directory / "report.json"
    path.write_text(json.dumps(report, indent=2))
    return path
