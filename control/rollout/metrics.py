"""The rollout's Prometheus metrics: its status, the canary's weight, each look's decision,
the analysis values and the thresholds they are judged against (no label from a request)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from control.rollout.analysis import AnalysisConfig, Decision
from control.rollout.state import RolloutRecord

ROLLOUT_STATE = Gauge("cascade_rollout_state", "1 for the rollout's current status.", ["status"])
ROLLOUT_WEIGHT = Gauge("cascade_rollout_canary_weight", "The canary's configured traffic share.")
ROLLOUT_DECISIONS = Counter(
    "cascade_rollout_decisions_total",
    "Rollout looks, by outcome and reason.",
    ["outcome", "reason"],
)
ROLLOUT_VALUES = Gauge(
    "cascade_rollout_analysis_value", "The last look's analysis values.", ["name"]
)
ROLLOUT_THRESHOLDS = Gauge(
    "cascade_rollout_analysis_threshold", "The thresholds the values are judged against.", ["name"]
)
PUBLISHED_VALUES = (
    "ctr_rate_control",
    "ctr_rate_canary",
    "ctr_difference",
    "ctr_cs_lower",
    "ctr_cs_upper",
    "ctr_non_inferiority_bound",
    "ctr_always_valid_p",
    "hit_rate_rate_control",
    "hit_rate_rate_canary",
    "error_rate_difference",
    "degraded_rate_difference",
    "srm_p",
    "p99_ms_control",
    "p99_ms_canary",
    "p99_ratio",
    "impressions_control",
    "impressions_canary",
)
STATUSES = ("running", "promoted", "rolled_back", "paused")


def publish(
    record: RolloutRecord, decision: Decision | None, paused: bool, config: AnalysisConfig
) -> None:
    """Set the gauges from the record (and from a look's ``decision``, when there is one)."""
    status = "paused" if paused and record.status == "running" else record.status
    for known in STATUSES:
        ROLLOUT_STATE.labels(known).set(1.0 if known == status else 0.0)
    ROLLOUT_WEIGHT.set(record.weight if record.status == "running" else 0.0)
    if decision is None:
        return
    for name in PUBLISHED_VALUES:
        value = decision.values.get(name)
        if isinstance(value, int | float):
            ROLLOUT_VALUES.labels(name).set(float(value))
    ROLLOUT_THRESHOLDS.labels("alpha").set(config.alpha)
    ROLLOUT_THRESHOLDS.labels("non_inferiority_margin").set(config.non_inferiority_margin)
    ROLLOUT_THRESHOLDS.labels("srm_alpha").set(config.srm_alpha)
    ROLLOUT_THRESHOLDS.labels("max_p99_ratio").set(config.max_p99_ratio)
