"""Prometheus metrics of the embedding cache (tier and reason labels from fixed sets)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

LOOKUPS = Counter(
    "cascade_embedding_cache_lookups_total",
    "Keys looked up: hits and misses per tier; unique keys fetched from Redis.",
    ["tier", "result"],
)
EVICTIONS = Counter("cascade_embedding_cache_evictions_total", "Rows evicted, per tier.", ["tier"])
DEFAULTS = Counter(
    "cascade_embedding_cache_default_rows_total",
    "Keys answered with the default (zero) row, by reason.",
    ["reason"],
)
LOOKUP_SECONDS = Histogram(
    "cascade_embedding_cache_lookup_seconds",
    "Latency of one batched lookup (all tables).",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
