"""The panels of Cascade's four dashboards, each a PromQL query set with its unit and the
alert thresholds it draws.

Panels plot the series the alert rules judge (the recording rules of
``monitoring/prometheus/recording_rules.yml``) and draw each alert's threshold from the
constant series the rules compare against (``cascade:threshold:*``), so a line on a dashboard
is always the number the alert uses; a test checks every alert has such a panel.
Label sets stay bounded: every ``by (...)`` names labels whose values come from fixed sets
(stage, reason, tier, served model versions, monitored features).
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
    """A threshold line: the constant series ``series`` that alert ``alert`` compares with,
    drawn from Prometheus, so the line is the number the alert uses."""

    series: str
    alert: str

    @property
    def query(self) -> Query:
        return Query(self.series, f"{self.alert} threshold")


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[Query, ...]
    unit: str = "short"  # Grafana unit id: short, percentunit, s, reqps, ...
    thresholds: tuple[Threshold, ...] = ()
    description: str = ""
    needs: str = "gateway"  # what must be scraped for data: gateway, rollout (a controller's
    # --metrics-port or a following gateway), triton (its metrics port: the ranker's cache too)
    threshold_unit: str | None = None  # thresholds in another unit (s, ratio): a second axis


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...]
    annotations: tuple[Query, ...] = field(default=())


RATE = "5m"  # the rate window of panels that have no recording rule


def _threshold(name: str, *alerts: str) -> tuple[Threshold, ...]:
    return tuple(Threshold(f"cascade:threshold:{name}", alert) for alert in alerts)


SERVICE = Dashboard(
    uid="cascade-service",
    title="Cascade / service health",
    description="Request rate, latency per stage, errors and degraded answers by reason, "
    "the breakers and the online store.",
    panels=(
        Panel(
            "Answers per second",
            (Query("sum(job:cascade_recommendations:rate5m)", "answers/s"),),
            unit="reqps",
        ),
        Panel(
            "End-to-end latency (p50, p99 over 5m)",
            (
                Query("max(job:cascade_request_latency_seconds:p50_rate5m)", "p50"),
                Query("max(job:cascade_request_latency_seconds:p99_rate5m)", "p99"),
            ),
            unit="s",
            thresholds=_threshold("request_p99_seconds", "CascadeRequestLatencyP99High"),
        ),
        Panel(
            "p99 latency per stage",
            (
                Query(
                    "max by (stage) (stage:cascade_stage_latency_seconds:p99_rate5m)", "{{stage}}"
                ),
            ),
            unit="s",
        ),
        Panel(
            "Model errors per answer",
            (Query("max(job:cascade_errors_per_answer:ratio_rate5m)", "errors per answer"),),
            unit="percentunit",
            thresholds=_threshold("error_ratio", "CascadeErrorRatioHigh"),
        ),
        Panel(
            "Degraded answers (share)",
            (Query("max(job:cascade_degraded_responses:ratio_rate5m)", "degraded"),),
            unit="percentunit",
            thresholds=_threshold("degraded_ratio", "CascadeDegradedRatioHigh"),
        ),
        Panel(
            "Fallbacks per answer by stage and reason",
            (
                Query(
                    "max by (stage, reason) "
                    "(stage_reason:cascade_fallbacks_per_answer:ratio_rate5m) or on () vector(0)",
                    "{{stage}} {{reason}}",
                ),
            ),
            unit="percentunit",
        ),
        Panel(
            "Calls refused by an open breaker (per second)",
            (
                Query(
                    "sum by (stage) (stage:cascade_circuit_open_fallbacks:rate1m)"
                    " or on () vector(0)",
                    "{{stage}}",
                ),
            ),
            unit="ops",
            description="features: the Redis breaker; retrieval and scoring: Triton's.",
        ),
        Panel(
            "Circuit breakers open",
            (
                Query(
                    "max by (breaker) (cascade_circuit_breakers_open)",
                    "{{breaker}}",
                ),
            ),
            thresholds=_threshold(
                "circuit_breakers_open", "CascadeRedisBreakerOpen", "CascadeTritonBreakerOpen"
            ),
            description="Breakers not closed, per name (the largest count over replicas): "
            "redis and triton in the gateways, embedding_cache_redis in the ranker (gateway "
            "or Triton).",
        ),
        Panel(
            "Online store state",
            (Query("max by (state) (cascade_online_store_state)", "{{state}}"),),
        ),
        Panel(
            "Impression sets not logged (per second)",
            (
                Query(
                    f"sum(rate(cascade_impressions_dropped_total[{RATE}])) or vector(0)",
                    "dropped",
                ),
            ),
            unit="ops",
        ),
    ),
)

MODELS = Dashboard(
    uid="cascade-models",
    title="Cascade / models",
    description="KPIs per served model version against its own baseline, the canary's weight "
    "and the rollout's analysis; rollout decisions as annotations.",
    panels=(
        Panel(
            "Answers per model version",
            (
                Query(
                    "sum by (model_version) (model_version:cascade_recommendations:rate5m)",
                    "v{{model_version}}",
                ),
            ),
            unit="reqps",
        ),
        Panel(
            "CTR per model version (30m) and its alert line (baseline x ratio)",
            (
                Query(
                    "max by (model_version) (model_version:cascade_ctr:ratio_rate30m)",
                    "v{{model_version}} CTR 30m",
                ),
                Query(
                    "max by (model_version) (model_version:cascade_ctr:ratio_rate6h offset 30m)"
                    " * on () group_left () cascade:threshold:ctr_vs_baseline_min_ratio",
                    "v{{model_version}} alert line",
                ),
            ),
            unit="percentunit",
            threshold_unit="ratio",
            thresholds=_threshold("ctr_vs_baseline_min_ratio", "CascadeCtrDrop"),
            description="The alert line is the version's CTR over the 6h before times the "
            "allowed ratio (drawn once 6h30m of history exist); the threshold series is the "
            "ratio itself.",
        ),
        Panel(
            "Hit rate per model version (answers with a click, 30m) and its alert line",
            (
                Query(
                    "max by (model_version) (model_version:cascade_hit_rate:ratio_rate30m)",
                    "v{{model_version}} hit rate 30m",
                ),
                Query(
                    "max by (model_version) "
                    "(model_version:cascade_hit_rate:ratio_rate6h offset 30m)"
                    " * on () group_left () cascade:threshold:hit_rate_vs_baseline_min_ratio",
                    "v{{model_version}} alert line",
                ),
            ),
            unit="percentunit",
            threshold_unit="ratio",
            thresholds=_threshold("hit_rate_vs_baseline_min_ratio", "CascadeHitRateDrop"),
            description="As for CTR: the version's hit rate over the 6h before times the "
            "allowed ratio.",
        ),
        Panel(
            "Canary weight per model version",
            (Query("max by (model_version) (cascade_canary_weight)", "v{{model_version}}"),),
            unit="percentunit",
            needs="rollout",
        ),
        Panel(
            "Catalog coverage (distinct items served / catalog)",
            (
                Query(
                    "max by (model_version) (model_version:cascade_catalog_coverage_ratio:avg)",
                    "v{{model_version}}",
                ),
            ),
            unit="percentunit",
        ),
        Panel(
            "Popularity of what is served (mean percentile)",
            (
                Query(
                    "max by (model_version) (model_version:cascade_served_popularity_mean:avg)",
                    "v{{model_version}}",
                ),
            ),
            unit="percentunit",
        ),
        Panel(
            "Rollout: CTR difference and its confidence sequence",
            (
                Query('max(cascade_rollout_analysis_value{name="ctr_difference"})', "difference"),
                Query('max(cascade_rollout_analysis_value{name="ctr_cs_lower"})', "lower bound"),
                Query('max(cascade_rollout_analysis_value{name="ctr_cs_upper"})', "upper bound"),
                Query(
                    'max(cascade_rollout_analysis_value{name="ctr_non_inferiority_bound"})',
                    "non-inferiority bound",
                ),
            ),
            needs="rollout",
        ),
        Panel(
            "Rollout looks per 15m by outcome",
            (
                Query(
                    "sum by (outcome) (increase(cascade_rollout_decisions_total[15m]))",
                    "{{outcome}}",
                ),
                Query('max(cascade_rollout_state{status="running"})', "running"),
            ),
            thresholds=(
                *_threshold("canary_seconds_without_decision", "CascadeCanaryNoDecision"),
                *_threshold("canary_seconds_holding", "CascadeCanaryHoldingTooLong"),
                *_threshold("canary_seconds_paused", "CascadeCanaryPaused"),
            ),
            needs="rollout",
            threshold_unit="s",
            description="A running rollout with no look in 15m, only holds for 30m, or paused "
            "for 10m alerts; the thresholds are those durations (right axis).",
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
    "version's training data, counted only with enough samples behind a value.",
    panels=(
        Panel(
            "PSI per feature (with enough samples)",
            (
                Query(
                    "max by (model_version, feature) "
                    "(model_version_feature:cascade_drift_psi:max_sampled)",
                    "v{{model_version}} {{feature}}",
                ),
            ),
            thresholds=_threshold("drift_psi", "CascadeFeatureDrift"),
        ),
        Panel(
            "Jensen-Shannon distance per feature (with enough samples)",
            (
                Query(
                    "max by (model_version, feature) "
                    "(model_version_feature:cascade_drift_js_distance:max_sampled)",
                    "v{{model_version}} {{feature}}",
                ),
            ),
            thresholds=_threshold("drift_js_distance", "CascadeScoreDistributionDrift"),
            description="The alert judges the score quantities only (retrieval_score, "
            "ranking_score): a few hundred per-request values put any quantity near 0.07.",
        ),
        Panel(
            "Share of features over the PSI threshold",
            (
                Query(
                    "max by (model_version) (model_version:cascade_drifted_features:ratio)",
                    "v{{model_version}}",
                ),
            ),
            unit="percentunit",
            thresholds=_threshold("drifted_features_share", "CascadeDriftedFeatureShare"),
        ),
        Panel(
            "Samples behind each drift value",
            (
                Query(
                    "min by (model_version, feature) (cascade_drift_samples)",
                    "v{{model_version}} {{feature}}",
                ),
            ),
            thresholds=_threshold("drift_min_samples", "CascadeFeatureDrift"),
            description="Values from fewer samples than the line are not judged.",
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
            "Embedding cache hit ratio (device + host tiers)",
            (Query("max(job:cascade_embedding_cache_hits:ratio_rate5m)", "hit ratio"),),
            unit="percentunit",
            thresholds=_threshold("embedding_cache_hit_ratio", "CascadeEmbeddingCacheHitRatioLow"),
            needs="triton",
        ),
        Panel(
            "Embedding cache lookups per tier and result",
            (
                Query(
                    "sum by (tier, result) (tier_result:cascade_embedding_cache_lookups:rate5m)",
                    "{{tier}} {{result}}",
                ),
            ),
            unit="ops",
            needs="triton",
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
            needs="triton",
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
