"""The panels of Cascade's four dashboards, each a PromQL query set with its unit and the
alert thresholds it draws.

Label sets stay bounded: every ``by (...)`` names labels whose values come from fixed sets
(stage, reason, tier, served model versions, monitored features). A threshold names the alert
it belongs to, and a test checks the number against the alert rule's expression, so a
dashboard never draws a line the alert does not use.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Query:
    """One PromQL expression and its legend (Grafana's ``{{label}}`` template syntax)."""

    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Threshold:
    """A horizontal line: the value an alert fires at (``alert``: the alert rule's name)."""

    value: float
    alert: str


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[Query, ...]
    unit: str = "short"  # Grafana unit id: short, percentunit, s, ops, ...
    thresholds: tuple[Threshold, ...] = ()
    description: str = ""
    needs: str = "gateway"  # what must be scraped for data: gateway, rollout, triton


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...]
    annotations: tuple[Query, ...] = field(default=())


RATE = "5m"  # the rate window of every panel (a few scrape intervals at any usual setting)

_DEGRADED_RATIO = (
    f"sum(rate(cascade_degraded_responses_total[{RATE}]))"
    f" / clamp_min(sum(rate(cascade_request_latency_seconds_count[{RATE}])), 1e-9)"
)

SERVICE = Dashboard(
    uid="cascade-service",
    title="Cascade / service health",
    description="Request rate, latency per stage, degraded answers by reason, the online store.",
    panels=(
        Panel(
            "Requests per second",
            (Query(f"sum(rate(cascade_request_latency_seconds_count[{RATE}]))", "requests/s"),),
            unit="reqps",
        ),
        Panel(
            "End-to-end latency (p50, p99)",
            (
                Query(
                    "histogram_quantile(0.5, sum by (le) "
                    f"(rate(cascade_request_latency_seconds_bucket[{RATE}])))",
                    "p50",
                ),
                Query(
                    "histogram_quantile(0.99, sum by (le) "
                    f"(rate(cascade_request_latency_seconds_bucket[{RATE}])))",
                    "p99",
                ),
            ),
            unit="s",
            thresholds=(Threshold(0.05, "CascadeLatencyP99High"),),
        ),
        Panel(
            "p99 latency per stage",
            (
                Query(
                    "histogram_quantile(0.99, sum by (le, stage) "
                    f"(rate(cascade_stage_latency_seconds_bucket[{RATE}])))",
                    "{{stage}}",
                ),
            ),
            unit="s",
        ),
        Panel(
            "Degraded answers (share of requests)",
            (Query(_DEGRADED_RATIO, "degraded"),),
            unit="percentunit",
            thresholds=(Threshold(0.05, "CascadeDegradedRatioHigh"),),
        ),
        Panel(
            "Fallbacks by stage and reason",
            (
                Query(
                    f"sum by (stage, reason) (rate(cascade_fallback_total[{RATE}]))",
                    "{{stage}} {{reason}}",
                ),
            ),
            unit="ops",
        ),
        Panel(
            "Online store state",
            (Query("max by (state) (cascade_online_store_state)", "{{state}}"),),
        ),
        Panel(
            "Impression sets not logged",
            (
                Query(
                    f"sum by (reason) (rate(cascade_impressions_dropped_total[{RATE}])) or "
                    "vector(0)",
                    "{{reason}}",
                ),
            ),
            unit="ops",
        ),
    ),
)

_CTR = (
    f'sum by (model_version) (rate(cascade_feedback_events_total{{type="click"}}[{RATE}]))'
    f" / clamp_min(sum by (model_version) (rate(cascade_impressions_total[{RATE}])), 1e-9)"
)
_HIT_RATE = (
    f"sum by (model_version) (rate(cascade_hits_total[{RATE}]))"
    f" / clamp_min(sum by (model_version) (rate(cascade_impression_sets_total[{RATE}])), 1e-9)"
)

MODELS = Dashboard(
    uid="cascade-models",
    title="Cascade / models",
    description="KPIs per served model version, the canary's weight and the rollout's analysis.",
    panels=(
        Panel(
            "Answers per model version",
            (
                Query(
                    f"sum by (model_version) (rate(cascade_recommendations_total[{RATE}]))",
                    "v{{model_version}}",
                ),
            ),
            unit="reqps",
        ),
        Panel("CTR per model version", (Query(_CTR, "v{{model_version}}"),), unit="percentunit"),
        Panel(
            "Hit rate per model version (answers with a click)",
            (Query(_HIT_RATE, "v{{model_version}}"),),
            unit="percentunit",
        ),
        Panel(
            "Canary weight per model version",
            (Query("max by (model_version) (cascade_canary_weight)", "v{{model_version}}"),),
            unit="percentunit",
        ),
        Panel(
            "Catalog coverage (distinct items served / catalog)",
            (
                Query(
                    "max by (model_version) (cascade_catalog_coverage_ratio)", "v{{model_version}}"
                ),
            ),
            unit="percentunit",
        ),
        Panel(
            "Popularity of what is served (mean percentile)",
            (
                Query(
                    "max by (model_version) (cascade_served_popularity_mean)",
                    "v{{model_version}}",
                ),
            ),
            unit="percentunit",
        ),
        Panel(
            "Rollout: CTR difference and its confidence sequence",
            (
                Query('cascade_rollout_analysis_value{name="ctr_difference"}', "difference"),
                Query('cascade_rollout_analysis_value{name="ctr_cs_lower"}', "lower bound"),
                Query('cascade_rollout_analysis_value{name="ctr_cs_upper"}', "upper bound"),
                Query(
                    'cascade_rollout_analysis_value{name="ctr_non_inferiority_bound"}',
                    "non-inferiority bound",
                ),
            ),
            needs="rollout",
        ),
        Panel(
            "Rollout decisions",
            (
                Query(
                    f"sum by (outcome, reason) (increase(cascade_rollout_decisions_total[{RATE}]))",
                    "{{outcome}} {{reason}}",
                ),
            ),
            needs="rollout",
        ),
    ),
    annotations=(
        Query("changes(cascade_desired_state_revision[1m]) > 0", "desired state changed"),
    ),
)

DRIFT = Dashboard(
    uid="cascade-drift",
    title="Cascade / drift",
    description="Population stability of the monitored features and scores against each "
    "version's training data, with the samples behind every value.",
    panels=(
        Panel(
            "PSI per feature",
            (
                Query(
                    "max by (model_version, feature) (cascade_drift_psi)",
                    "v{{model_version}} {{feature}}",
                ),
            ),
            thresholds=(Threshold(0.25, "CascadeFeatureDrift"),),
        ),
        Panel(
            "Jensen-Shannon distance per feature",
            (
                Query(
                    "max by (model_version, feature) (cascade_drift_js_distance)",
                    "v{{model_version}} {{feature}}",
                ),
            ),
        ),
        Panel(
            "Samples behind each drift value",
            (
                Query(
                    "min by (model_version, feature) (cascade_drift_samples)",
                    "v{{model_version}} {{feature}}",
                ),
            ),
        ),
    ),
)

CACHE_AND_TRITON = Dashboard(
    uid="cascade-cache-triton",
    title="Cascade / embedding cache and Triton",
    description="Hit ratio and latency of the embedding cache tiers; Triton's queue and "
    "compute time per model and version.",
    panels=(
        Panel(
            "Embedding cache hit ratio per tier",
            (
                Query(
                    "sum by (tier) (rate(cascade_embedding_cache_lookups_total"
                    f'{{result="hit"}}[{RATE}])) / clamp_min(sum by (tier) '
                    "(rate(cascade_embedding_cache_lookups_total"
                    f'{{result=~"hit|miss"}}[{RATE}])), 1e-9)',
                    "{{tier}}",
                ),
            ),
            unit="percentunit",
        ),
        Panel(
            "Embedding cache lookup p99",
            (
                Query(
                    "histogram_quantile(0.99, sum by (le) "
                    f"(rate(cascade_embedding_cache_lookup_seconds_bucket[{RATE}])))",
                    "p99",
                ),
            ),
            unit="s",
        ),
        Panel(
            "Triton queue time per request",
            (
                Query(
                    f"sum by (model, version) (rate(nv_inference_queue_duration_us[{RATE}]))"
                    f" / clamp_min(sum by (model, version) "
                    f"(rate(nv_inference_request_success[{RATE}])), 1e-9) / 1e6",
                    "{{model}} v{{version}}",
                ),
            ),
            unit="s",
            needs="triton",
        ),
        Panel(
            "Triton compute time per request",
            (
                Query(
                    "sum by (model, version) "
                    f"(rate(nv_inference_compute_infer_duration_us[{RATE}]))"
                    f" / clamp_min(sum by (model, version) "
                    f"(rate(nv_inference_request_success[{RATE}])), 1e-9) / 1e6",
                    "{{model}} v{{version}}",
                ),
            ),
            unit="s",
            needs="triton",
        ),
    ),
)

DASHBOARDS = (SERVICE, MODELS, DRIFT, CACHE_AND_TRITON)


def all_panels() -> list[tuple[Dashboard, Panel]]:
    return [(dashboard, panel) for dashboard in DASHBOARDS for panel in dashboard.panels]
