"""Prometheus metrics of the gateway (prefix ``cascade_``; label values from fixed sets).

With more than one worker process (``cascade serve --workers N``) every worker counts into
files under ``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client's multiprocess mode) and
``/metrics``, whichever worker answers it, renders all of them: counters and histograms
summed, each gauge combined as its ``multiprocess_mode`` says (ignored with one process).
The drift and KPI gauges are each worker's own window over its share of the traffic; the
most recent export wins (a PSI and its sample count come from the same export).
"""

from __future__ import annotations

import os
from collections.abc import Container

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"


def multiprocess_dir() -> str | None:
    """Where the workers' metric files are, when the gateway runs in multiprocess mode."""
    return os.environ.get(MULTIPROCESS_ENV) or None


def render_metrics() -> bytes:
    """The text exposition of this process's metrics, or of every worker's."""
    if multiprocess_dir() is None:
        return generate_latest(REGISTRY)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return generate_latest(registry)


def worker_exited(pid: int) -> None:
    """Drop an exited worker's live gauges (multiprocess mode; a no-op otherwise)."""
    if multiprocess_dir() is not None:
        multiprocess.mark_process_dead(pid)


STAGES = ("features", "retrieval", "filtering", "scoring", "ordering")
REASONS = (
    "timeout",
    "circuit_open",
    "error",
    "cold_start",
    "too_few_candidates",
    "bad_scores",
    "embeddings_unavailable",
    "store_empty",
)
STORE_STATES = ("ok", "empty", "loading", "unreachable", "unknown")
OTHER_VERSION = "other"  # the label of a model version this gateway does not serve
UNATTRIBUTED = "unattributed"  # the label of feedback whose request_id resolves to no version


def version_label(version: int | None, served: Container[int]) -> str:
    """A model_version label value: a version this gateway serves, else one fixed bucket.
    Label values never come from request bodies."""
    if version is None:
        return UNATTRIBUTED
    return str(version) if version in served else OTHER_VERSION


STAGE_LATENCY = Histogram(
    "cascade_stage_latency_seconds",
    "Time spent in each serving stage.",
    ["stage"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
REQUEST_LATENCY = Histogram(
    "cascade_request_latency_seconds",
    "End-to-end latency of /v1/recommend.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
FALLBACKS = Counter(
    "cascade_fallback_total", "Fallbacks taken, by stage and reason.", ["stage", "reason"]
)
RETRIEVED = Counter(
    "cascade_retrieval_candidates_total",
    "Candidates retrieved, by source (ann, item_neighbors, popularity); an item two sources "
    "found counts once, for the first.",
    ["source"],
)
DEGRADED = Counter("cascade_degraded_responses_total", "Responses served with degraded: true.")
RECOMMENDATIONS = Counter(
    "cascade_recommendations_total",
    "Recommendation responses per model version.",
    ["model_version"],
)
FEEDBACK = Counter(
    "cascade_feedback_events_total",
    "Feedback events stored (a retried event_id counts once), per model version that served "
    "the answer (a served version, 'other', or 'unattributed': every event not trust=served), "
    "outcome type, and trust level: served (about a logged answer of the same user showing "
    "the item), organic (no request_id), unknown_request, user_mismatch, item_not_shown, "
    "unknown_id (a user or item id the serving release does not know).",
    ["model_version", "type", "trust"],
)
IMPRESSION_SETS = Counter(
    "cascade_impression_sets_total",
    "Answers logged as impression sets, per model version.",
    ["model_version"],
)
IMPRESSIONS = Counter(
    "cascade_impressions_total",
    "Items shown (positions of logged answers), per model version: the CTR denominator.",
    ["model_version"],
)
HITS = Counter(
    "cascade_hits_total",
    "Impression sets that got at least one click, per model version: hit rate = hits / sets.",
    ["model_version"],
)
IMPRESSIONS_DROPPED = Counter(
    "cascade_impressions_dropped_total",
    "Impression sets not logged, by reason (queue_full, store_error).",
    ["reason"],
)
UNKNOWN_EXCLUDE_ITEMS = Counter(
    "cascade_unknown_exclude_items_total",
    "Item ids in requests' exclude lists that name no item of the serving release (not in its "
    "id map, or not in its catalog): ignored.",
)
FEEDBACK_DUPLICATES = Counter(
    "cascade_feedback_duplicates_total",
    "Feedback events not stored again because their event_id was stored before.",
)
ONLINE_STORE_STATE = Gauge(
    "cascade_online_store_state",
    "1 for the online store's current state (ok, empty, loading, unreachable, unknown).",
    ["state"],
    multiprocess_mode="livemax",
)
CANARY_WEIGHT = Gauge(
    "cascade_canary_weight",
    "Share of users this gateway routes to each served model version.",
    ["model_version"],
    multiprocess_mode="livemostrecent",
)
ROLLOUT_REVISION = Gauge(
    "cascade_desired_state_revision",
    "Revision of the desired serving state last applied (the oldest among workers).",
    multiprocess_mode="livemin",
)
BREAKERS_OPEN = Gauge(
    "cascade_circuit_breakers_open",
    "Circuit breakers of this name that are open or half-open (refusing calls, but for one "
    "probe): redis, triton, embedding_cache_redis.",
    ["breaker"],
    multiprocess_mode="livesum",
)
REPLICA_CONVERGED = Gauge(
    "cascade_replica_converged",
    "1 when this replica applied the desired state and its inference server serves every "
    "desired version (checked on the server), else 0 (the lowest among workers).",
    multiprocess_mode="livemin",
)
RECONCILE_ACTIONS = Counter(
    "cascade_reconcile_actions_total",
    "Model versions the reconcile loop loaded or unloaded on this replica's inference server "
    "because it served other versions than the replica's (a restarted server shows as loads).",
    ["action"],
)
for _action in ("load", "unload"):
    RECONCILE_ACTIONS.labels(action=_action)  # both exported from the start
VERSION_LOAD_FAILURES = Counter(
    "cascade_version_load_failures_total",
    "Desired model versions this gateway could not load, by role (production, canary).",
    ["role"],
)
DRIFT_PSI = Gauge(
    "cascade_drift_psi",
    "Population stability index of a monitored quantity over the drift window against the "
    "version's reference bins (empty bins count as 1e-4).",
    ["model_version", "feature"],
    multiprocess_mode="livemostrecent",
)
DRIFT_JS = Gauge(
    "cascade_drift_js_distance",
    "Jensen-Shannon distance (base 2, 0..1) of a monitored quantity's window bins against the "
    "version's reference bins.",
    ["model_version", "feature"],
    multiprocess_mode="livemostrecent",
)
DRIFT_SAMPLES = Gauge(
    "cascade_drift_samples",
    "Values counted in the drift window behind each PSI / JS value.",
    ["model_version", "feature"],
    multiprocess_mode="livemostrecent",
)
DRIFT_REFERENCE = Gauge(
    "cascade_drift_reference_info",
    "1 for a served version whose drift reference is loaded (its drift is exported).",
    ["model_version"],
    multiprocess_mode="livemax",
)
DRIFT_WINDOW = Gauge(
    "cascade_drift_window_seconds",
    "Length of the drift and KPI window.",
    multiprocess_mode="livemax",
)
CATALOG_COVERAGE = Gauge(
    "cascade_catalog_coverage_ratio",
    "Distinct catalog items served in the window / catalog size, per model version.",
    ["model_version"],
    multiprocess_mode="livemostrecent",
)
SERVED_POPULARITY = Gauge(
    "cascade_served_popularity_mean",
    "Mean training-popularity percentile (0 least, 1 most popular) of the items served in the "
    "window, per model version.",
    ["model_version"],
    multiprocess_mode="livemostrecent",
)
RETRAIN_REQUESTS = Counter(
    "cascade_retrain_requests_total",
    "Alertmanager notifications at POST /v1/admin/alerts, by decision (enqueued, duplicate, "
    "cooldown, resolved, not_retrain).",
    ["decision"],
)
for _decision in ("enqueued", "duplicate", "cooldown", "resolved", "not_retrain"):
    RETRAIN_REQUESTS.labels(decision=_decision)  # every decision exported from the start
