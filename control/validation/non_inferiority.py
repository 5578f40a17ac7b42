"""Non-inferiority of the candidate against production: one check per metric.

For each metric with a margin, the paired bootstrap interval (resampling holdout users) of
the relative difference candidate vs production must lie above -margin; a point estimate
alone never passes. A check that does not pass says which way: ``worse`` (the whole interval
below -margin) or ``insufficient_evidence`` (the interval straddles -margin, or there is
nothing to compare on): the holdout is too small to tell, and the detail estimates how many
times its users would do at the same difference. Both fail the gate; the verdict lists them
apart.
"""

from __future__ import annotations

import numpy as np

from control.validation.bootstrap import paired_ranking_metric, paired_user_metric
from control.validation.config import LOWER_IS_BETTER, GateConfig
from control.validation.holdout import EvalSet
from control.validation.scoring import Scored
from control.validation.verdict import Check

RETRIEVAL_METRICS = ("recall@10", "ndcg@10")

NON_INFERIOR, WORSE, INSUFFICIENT = "non_inferior", "worse", "insufficient_evidence"


def non_inferiority_outcome(relative: float, low: float, high: float, margin: float) -> str:
    """``non_inferior`` (low > -margin), ``worse`` (high < -margin), else
    ``insufficient_evidence``; NaN bounds (nothing to compare) are insufficient evidence."""
    if np.isfinite(low) and low > -margin:
        return NON_INFERIOR
    if np.isfinite(high) and high < -margin:
        return WORSE
    return INSUFFICIENT


def users_needed_factor(relative: float, low: float, margin: float) -> float | None:
    """How many times the holdout's users would bring the lower bound above -margin at the
    same point estimate (the interval narrows as 1 / sqrt(users)); None when the point
    estimate itself is at or below -margin (no holdout size would do)."""
    if not (np.isfinite(relative) and np.isfinite(low)) or relative <= -margin:
        return None
    return float(((relative - low) / (relative + margin)) ** 2)


def _outcome_detail(
    outcome: str, relative: float, low: float, margin: float, users: int = 0, rows: int = 0
) -> str:
    """The outcome in words; when the holdout is too small, about how many more of its
    ``users`` (and of its ``rows``, at the same rows per user) would decide."""
    if outcome == NON_INFERIOR:
        return "non-inferior"
    if outcome == WORSE:
        return f"WORSE: the whole interval is below -{margin:g}"
    factor = users_needed_factor(relative, low, margin)
    if factor is None:
        more = "the point estimate itself is below the margin"
    else:
        more = f"about {factor:.1f}x the holdout users would show it at this difference"
        if users > 0 and factor > 1:
            more += (
                f": about {(factor - 1) * users:,.0f} more users, "
                f"{(factor - 1) * rows:,.0f} more ranking rows"
            )
    return f"INSUFFICIENT EVIDENCE: the interval straddles -{margin:g}, holdout too small ({more})"


def non_inferiority_checks(
    candidate: Scored, production: Scored, evals: EvalSet, config: GateConfig
) -> list[Check]:
    rules = config.non_inferiority
    labels = evals.rank_rows["label"].to_numpy()
    row_users = evals.rank_rows["user_id"].to_numpy()
    checks = []
    for metric, margin in rules.margins.items():
        retrieval = metric in RETRIEVAL_METRICS
        if (len(evals.users) if retrieval else len(labels)) == 0:
            checks.append(
                Check(
                    f"non_inferiority.{metric}",
                    float("nan"),
                    -margin,
                    False,
                    f"INSUFFICIENT EVIDENCE: no holdout {'users' if retrieval else 'ranking rows'} "
                    "to compare on",
                    kind="non_inferiority",
                    outcome=INSUFFICIENT,
                )
            )
            continue
        if retrieval:
            interval = paired_user_metric(
                candidate.retrieval[metric],
                production.retrieval[metric],
                rules.resamples,
                rules.confidence,
                rules.seed,
            )
        else:
            interval = paired_ranking_metric(
                metric,
                labels,
                candidate.logits,
                production.logits,
                row_users,
                rules.resamples,
                rules.confidence,
                rules.seed,
            )
        better = "lower" if metric in LOWER_IS_BETTER else "higher"
        outcome = non_inferiority_outcome(interval.relative, interval.low, interval.high, margin)
        bounds = (interval.relative, interval.low)
        checks.append(
            Check(
                f"non_inferiority.{metric}",
                interval.relative,
                -margin,
                outcome == NON_INFERIOR,
                f"{_outcome_detail(outcome, *bounds, margin, len(evals.users), len(labels))}: "
                f"candidate {interval.candidate:.4f} vs production {interval.production:.4f} "
                f"({better} is better); lower bound must be > -{margin:g}; interval width "
                f"{interval.high - interval.low:.3g} on {len(evals.users)} users",
                (interval.low, interval.high),
                "non_inferiority",
                outcome,
            )
        )
    return checks
