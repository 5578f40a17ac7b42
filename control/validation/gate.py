"""The validation gate: candidate and production on the same recent holdout.

A candidate passes only if every check passes:

- floors: Recall@10, NDCG@10, AUC on the whole holdout at least their floors, LogLoss at most
  its ceiling;
- non-inferiority (when there is a production version): for each main metric, the lower
  bound of the paired bootstrap interval of the relative difference (candidate vs
  production, resampling users) is above -margin; a point estimate alone never passes. A
  failed comparison says which way: ``worse`` or ``insufficient evidence``
  (``control.validation.non_inferiority``);
- slices: each declared slice has its minimum sample (else it fails as missing) and passes
  its own floors;
- sanity: finite, non-constant scores; ONNX equals torch on holdout inputs; the ANN index
  finds >= 0.95 of the exact top 100; the export loads in the gateway and answers.

With no production version (first deploy) only floors, slices and sanity apply, and the
verdict says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np

from control.validation import sanity
from control.validation.config import LOWER_IS_BETTER, GateConfig
from control.validation.holdout import SLICES, EvalSet, Holdout, build_eval_set
from control.validation.non_inferiority import RETRIEVAL_METRICS, non_inferiority_checks
from control.validation.scoring import ExportedVersion, Scored
from control.validation.verdict import Check, Verdict
from core.errors import ArtifactError, ConfigError
from pipelines.config import TrainConfig
from pipelines.evaluation.metrics import auc, logloss, sigmoid
from pipelines.evaluation.popularity_check import describe, recorded_checks

log = logging.getLogger(__name__)
FIRST_DEPLOY = "first deploy: floors only (no production version to compare with)"


def _ranking_value(metric: str, labels: np.ndarray, logits: np.ndarray) -> float:
    if len(labels) == 0 or labels.min() == labels.max():
        return float("nan")
    if metric == "auc":
        return auc(labels, logits)
    return logloss(labels, sigmoid(logits))


def _metric(
    scored: Scored,
    evals: EvalSet,
    metric: str,
    users: np.ndarray | None = None,
    rows: np.ndarray | None = None,
) -> float:
    if metric in RETRIEVAL_METRICS:
        values = scored.retrieval.get(metric, np.zeros(0))
        values = values if users is None else values[users]
        return float(values.mean()) if len(values) else float("nan")
    labels = evals.rank_rows["label"].to_numpy()
    logits = scored.logits
    if rows is not None:
        labels, logits = labels[rows], logits[rows]
    return _ranking_value(metric, labels, logits)


def _bound_check(
    name: str, value: float, threshold: float, ceiling: bool, kind: str, detail: str = ""
) -> Check:
    passed = bool(np.isfinite(value)) and (value <= threshold if ceiling else value >= threshold)
    return Check(name, value, threshold, passed, detail, kind="ceiling" if ceiling else kind)


def floor_checks(scored: Scored, evals: EvalSet, config: GateConfig) -> list[Check]:
    return [
        _bound_check(
            f"floor.{metric}",
            _metric(scored, evals, metric),
            threshold,
            metric in LOWER_IS_BETTER,
            "floor",
        )
        for metric, threshold in config.floors.as_dict().items()
    ]


def slice_checks(scored: Scored, evals: EvalSet, config: GateConfig) -> list[Check]:
    unknown = sorted(set(config.slices) - set(SLICES))
    if unknown:
        raise ConfigError(f"gate config declares unknown slices {unknown}; known: {list(SLICES)}")
    labels = evals.rank_rows["label"].to_numpy()
    checks = []
    for name, rule in config.slices.items():
        users = np.flatnonzero(evals.user_slices[name]) if len(evals.users) else np.zeros(0, int)
        rows = evals.row_slices[name]
        row_labels = labels[rows]
        both = len(row_labels) > 0 and row_labels.min() != row_labels.max()
        n_users, n_rows = len(users), int(rows.sum())
        enough = n_users >= rule.min_users and n_rows >= rule.min_rows and both
        checks.append(
            Check(
                f"slice.{name}.sample",
                float(min(n_users, n_rows)),
                float(rule.min_users),
                enough,
                f"{n_users} users (min {rule.min_users}), {n_rows} ranking rows "
                f"(min {rule.min_rows}{', both labels' if both else ', NOT both labels'})"
                + ("" if enough else ": slice missing"),
                kind="slice",
            )
        )
        for metric, floor in rule.floors.items():
            if metric in RETRIEVAL_METRICS:
                if name == "long_tail_items":  # recall of the long-tail positives themselves
                    values = scored.tail.get(metric, np.zeros(0))
                    value = float(values.mean()) if len(values) else float("nan")
                else:
                    value = _metric(scored, evals, metric, users=users)
            else:
                value = _metric(scored, evals, metric, rows=rows)
            check = _bound_check(
                f"slice.{name}.{metric}", value, floor, metric in LOWER_IS_BETTER, "slice"
            )
            check.passed = check.passed and enough
            checks.append(check)
    return checks


def sanity_checks(
    root: Path,
    version: ExportedVersion,
    scored: Scored,
    holdout: Holdout,
    evals: EvalSet,
    config: GateConfig,
    workdir: Path | None,
    train_config: TrainConfig | None,
) -> list[Check]:
    rules = config.sanity
    checks = []
    sample = scored.queries[: rules.ann_queries]
    retrieval_scores = (sample @ version.item_embeddings.T).ravel()
    for name, values in (("retrieval", retrieval_scores), ("ranking", scored.logits)):
        finite, std, detail = sanity.score_spread(values)
        checks.append(
            Check(
                f"sanity.{name}_scores",
                std,
                rules.min_score_std,
                finite and std >= rules.min_score_std,
                detail,
                kind="sanity",
            )
        )
    if workdir is not None and train_config is not None:
        features, history = version.query_inputs(holdout, evals)
        sparse, dense = version.ranking_inputs(holdout, evals)
        differences = sanity.onnx_difference(
            version,
            workdir,
            train_config,
            features[:2048],
            history[:2048],
            sparse[:4096],
            dense[:4096],
        )
        for model, difference in differences.items():
            checks.append(
                Check(
                    f"sanity.onnx_equals_torch.{model}",
                    difference,
                    rules.onnx_tolerance,
                    difference <= rules.onnx_tolerance,
                    "max |ONNX - torch| on holdout inputs",
                    kind="sanity",
                )
            )
    recall = sanity.ann_recall(version, sample)
    checks.append(
        Check(
            "sanity.ann_recall@100",
            recall,
            rules.ann_recall_at_100,
            bool(np.isfinite(recall)) and recall >= rules.ann_recall_at_100,
            f"index {version.release.manifest.get('index', {}).get('kind')} vs exact "
            f"search, {len(sample)} holdout queries",
            kind="sanity",
        )
    )
    if rules.smoke:
        known = [u for u, s in zip(evals.users.tolist(), evals.seen, strict=True) if len(s)]
        user = known[0] if known else int(holdout.users["user_id"].iloc[0])
        ok, detail = sanity.smoke_request(root, version.version, user)
        checks.append(
            Check("sanity.smoke_request", 1.0 if ok else 0.0, 1.0, ok, detail, kind="sanity")
        )
    return checks


def training_checks(manifest: dict, workdir: Path | None) -> list[Check]:
    """The beats-popularity checks recorded at training: a candidate whose two-tower (or
    ranker) did not beat popularity on validation fails here too, even if it was exported
    with the override (``--force`` registers it anyway, as for any failed check)."""
    return [
        Check(
            f"training.{c['model']}_beats_{c['baseline']}",
            c["value"],
            c["baseline_value"],
            c["passed"],
            describe(c),
            kind="sanity",
        )
        for c in recorded_checks(manifest, workdir)
    ]


def run_gate(
    root: Path,
    candidate: int,
    production: int | None,
    holdout: Holdout,
    config: GateConfig,
    data_hash: str,
    notes: list[str] | None = None,
    workdir: Path | None = None,
    train_config: TrainConfig | None = None,
    report: Callable[[str], None] = lambda _: None,
) -> Verdict:
    """Judge ``candidate`` (a complete version under ``root``) against ``production``.

    The holdout must hold no row production learnt from (``cascade retrain`` splits so);
    ``notes`` (what the holdout is made of) go into the verdict.
    """
    notes = [*(notes or [])]
    if production is None:
        notes.append(FIRST_DEPLOY)
    evals = build_eval_set(holdout, config, seed=config.non_inferiority.seed)
    notes += evals.notes
    ranks = evals.rank_rows
    summary = {
        "rows": len(holdout.rows),
        "users": len(evals.users),
        "ranking_rows": len(ranks),
        "positive_rate": float(ranks["label"].mean()) if len(ranks) else None,
        "from_timestamp": int(holdout.rows["timestamp"].min()) if len(holdout.rows) else None,
        "to_timestamp": int(holdout.rows["timestamp"].max()) if len(holdout.rows) else None,
    }
    checks = [
        Check(
            "holdout.users",
            float(len(evals.users)),
            float(config.holdout.min_users),
            len(evals.users) >= config.holdout.min_users,
            f"{len(evals.users)} users with a new positive, {len(ranks)} ranking rows",
            kind="sanity",
        )
    ]
    report(f"gate: scoring candidate {candidate} on {len(evals.users)} users, {len(ranks)} rows")
    version = ExportedVersion(root, candidate)
    version.load()
    try:
        scored = version.score(holdout, evals)
        checks += training_checks(version.release.manifest, workdir)
        checks += floor_checks(scored, evals, config)
        if production is not None:
            report(f"gate: scoring production {production} on the same holdout")
            try:
                other = ExportedVersion(root, production)
                other.load()
            except (ArtifactError, OSError) as error:
                checks.append(
                    Check(
                        "non_inferiority.production_loads",
                        0.0,
                        1.0,
                        False,
                        f"production {production} cannot be scored: {error}",
                        kind="non_inferiority",
                    )
                )
            else:
                try:
                    production_scored = other.score(holdout, evals)
                finally:
                    other.close()
                report("gate: paired bootstrap")
                checks += non_inferiority_checks(scored, production_scored, evals, config)
        checks += slice_checks(scored, evals, config)
        report("gate: sanity checks")
        checks += sanity_checks(
            root, version, scored, holdout, evals, config, workdir, train_config
        )
    finally:
        version.close()
    return Verdict(
        candidate=candidate,
        production=production,
        checks=checks,
        data_hash=data_hash,
        holdout_hash=holdout.content_hash(),
        holdout=summary,
        notes=notes,
    )
