"""The "beats popularity" check: a model that does not beat the popularity baseline on
validation has learnt nothing a count could not tell, and must not be exported.

Each check is a plain record (JSON in ``retrieval_result.json`` / ``ranking_result.json``,
the report and the export manifest's ``quality_checks``), so the validation gate reads the
same verdict the pipeline acted on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.errors import CascadeError

OVERRIDE_OPTION = "--allow-below-popularity"
RESULT_FILES = ("retrieval_result.json", "ranking_result.json")


class BelowPopularityError(CascadeError):
    """A model did not beat the popularity baseline on validation."""


def popularity_check(
    model: str, value: float, baseline: str, baseline_value: float, metric: str, allowed: bool
) -> dict[str, Any]:
    """Record whether ``model`` beat ``baseline`` on validation ``metric`` (higher is better)."""
    passed = bool(value > baseline_value)
    return {
        "model": model,
        "baseline": baseline,
        "metric": metric,
        "split": "valid",
        "value": float(value),
        "baseline_value": float(baseline_value),
        "passed": passed,
        "overridden": bool(allowed and not passed),
    }


def describe(check: dict[str, Any]) -> str:
    verb = "beats" if check["passed"] else "does NOT beat"
    return (
        f"{check['model']} {verb} {check['baseline']} on {check['split']} {check['metric']}: "
        f"{check['value']:.4f} vs {check['baseline_value']:.4f}"
        + (" (overridden)" if check["overridden"] else "")
    )


def with_override(checks: list[dict[str, Any]], allowed: bool) -> list[dict[str, Any]]:
    """The checks with ``overridden`` set where one failed and ``allowed`` (an override
    given to a later step, e.g. ``cascade train export --allow-below-popularity``)."""
    return [{**c, "overridden": c["overridden"] or (allowed and not c["passed"])} for c in checks]


def enforce(checks: list[dict[str, Any]]) -> None:
    """Raise ``BelowPopularityError`` naming every failed, non-overridden check."""
    failed = [c for c in checks if not c["passed"] and not c["overridden"]]
    if failed:
        raise BelowPopularityError(
            "; ".join(describe(c) for c in failed)
            + f". Export blocked: train longer or fix the model, or pass {OVERRIDE_OPTION} "
            "to export anyway (recorded in the manifest)."
        )


def recorded_checks(manifest: dict[str, Any], workdir: Path | None = None) -> list[dict[str, Any]]:
    """The checks a version was trained with: the manifest's ``quality_checks`` (written by
    ``cascade train``), else those in ``workdir``'s step results (``cascade retrain``)."""
    if "quality_checks" in manifest:
        return list(manifest["quality_checks"])
    if workdir is None:
        return []
    checks = []
    for name in RESULT_FILES:
        path = workdir / name
        if path.is_file():
            check = json.loads(path.read_text()).get("popularity_check")
            if check is not None:
                checks.append(check)
    return checks
