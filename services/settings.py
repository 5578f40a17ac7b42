"""The gateway's one settings object: environment variables prefixed ``CASCADE_``.

Nested settings use ``__`` as the separator, e.g. ``CASCADE_REDIS__TIMEOUT_MS=30``.
With neither ``CASCADE_REDIS__URL`` nor ``CASCADE_TRITON__URL`` set, the gateway runs the
embedded default: the exported artifacts in process and an in-memory store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from core.item_neighbors import DEFAULT_SHARE
from services.util.redis_client import is_cluster, is_sentinel, sentinel_target


class BreakerSettings(BaseModel):
    """Circuit breaker: open after ``failures`` consecutive failures, retry after ``reset_s``."""

    failures: int = Field(5, ge=1, description="Consecutive failures that open the breaker.")
    reset_s: float = Field(2.0, gt=0, description="Seconds before a half-open trial call.")


class RedisSettings(BaseModel):
    """Redis by role (docs/redis.md): ``url`` holds the rebuildable data (features, embedding
    rows); ``durable_url`` the data nothing can rebuild (streams, registry, desired state,
    rollout log, retrain queue). One URL serves both roles."""

    url: str | None = Field(
        None,
        description="Rebuildable role: the online features and embedding rows, and the durable "
        "role too while durable_url is unset. redis://host:port/db, or redis+cluster://host:port "
        "(any one node) for a Redis Cluster; unset = in-memory store.",
    )
    durable_url: str | None = Field(
        None,
        description="Durable role: feedback and impression streams, answers, registry, desired "
        "state, rollout log, retrain queue. One Redis (AOF, a replica), never a Cluster: "
        "redis://host:port/db, or redis+sentinel://host:26379,host:26379/service/db for a "
        "primary whose replica Sentinels promote (docs/redis.md); unset = url.",
    )
    timeout_ms: float = Field(25.0, gt=0, description="Per-call timeout of the request path.")
    feedback_timeout_ms: float = Field(
        250.0,
        gt=0,
        description="Per-call timeout of POST /v1/feedback's Redis calls (attribution lookups, "
        "the durable append). Not on an answer's latency path, so longer than timeout_ms: a "
        "busy Redis delays a click instead of refusing it (a refused click gets a 503, which "
        "the client may retry with the same event_id).",
    )
    namespace: str = Field("cascade", description="Key prefix (keys are versioned below it).")
    breaker: BreakerSettings = BreakerSettings()
    auto_materialize: bool = Field(
        True,
        description="When the store comes back empty (no completeness marker), reload the "
        "served release's users into it from the gateway (one replica at a time, under a lock).",
    )

    @property
    def durable(self) -> str | None:
        """The durable role's URL: ``durable_url``, else ``url``."""
        return self.durable_url or self.url

    @model_validator(mode="after")
    def _roles(self) -> RedisSettings:
        if self.durable_url and not self.url:
            raise ValueError("redis.durable_url needs redis.url (the features and embedding rows)")
        if self.durable_url and is_cluster(self.durable_url):
            raise ValueError(
                "redis.durable_url must be one Redis (redis:// or rediss://), not a Cluster: "
                "the streams' appends are scripts over keys of several slots"
            )
        if self.url and is_sentinel(self.url):
            raise ValueError(
                "redis.url takes redis:// or redis+cluster:// (the rebuildable role); a "
                "Sentinel-watched Redis (redis+sentinel://) goes in redis.durable_url"
            )
        if self.durable_url and is_sentinel(self.durable_url):
            sentinel_target(self.durable_url)  # a malformed one fails here, naming why
        if self.url and is_cluster(self.url) and not self.durable_url:
            raise ValueError(
                "redis.url is a Redis Cluster: set redis.durable_url to one Redis for the "
                "streams, registry, desired state and retrain queue"
            )
        return self


class TritonSettings(BaseModel):
    """Inference server."""

    url: str | None = Field(None, description="host:port of Triton; unset = in-process models.")
    protocol: Literal["http", "grpc"] = Field("http", description="Triton client protocol.")
    query_tower: Literal["gateway", "triton"] = Field(
        "gateway",
        description="Where the query tower runs when Triton is configured: gateway = the "
        "same exported ONNX in this process (no round trip; measured cheaper), triton = on "
        "the server. The ranker always runs on Triton.",
    )
    timeout_ms: float = Field(
        40.0,
        gt=0,
        description="Per-call timeout of one inference; must exceed embedding_cache.timeout_ms.",
    )
    breaker: BreakerSettings = BreakerSettings()
    control_key: SecretStr | None = Field(
        None,
        description="Key of Triton's restricted APIs (model load/unload): sent as header "
        "triton-control-key. Unset with `cascade serve --triton`: a random key per start.",
    )


class EmbeddingCacheSettings(BaseModel):
    """DLRM embedding rows: the device -> host -> Redis cache whenever a Redis is configured
    (rows written by ``cascade materialize``), else whole tables in memory."""

    enabled: bool = Field(True, description="false = whole tables in memory even with Redis.")
    in_memory_max_mb: float = Field(
        256.0,
        ge=0,
        description="A model version whose tables (rows x dim x 4 bytes, all tables) fit in "
        "this many MiB is served from plain in-process arrays, without cache tiers; bigger "
        "ones go through the cache. 0 = always the cache.",
    )
    redis_url: str | None = Field(
        None,
        description="Backing Redis of the cache (rebuildable role; redis+cluster:// for a "
        "Redis Cluster); unset = the online store's redis.url.",
    )
    namespace: str = Field("cascade", description="Key prefix of the embedding rows.")
    device_capacity: float = Field(
        0.05, gt=0, description="Rows (> 1) or fraction of all tables' rows (<= 1)."
    )
    host_capacity: float = Field(
        0.2, gt=0, description="Rows (> 1) or fraction of all tables' rows (<= 1)."
    )
    policy: Literal["lru", "lfu"] = Field("lru", description="Eviction policy of both tiers.")
    async_threshold: float = Field(
        0.9,
        ge=0,
        le=1,
        description="Hit ratio above which inserts (and deferred misses) are async.",
    )
    miss_policy: Literal["fetch", "defer"] = Field(
        "fetch",
        description="fetch = misses read from Redis on the request path (exact); defer = above "
        "async_threshold, misses get the default row now and are read in the background.",
    )
    timeout_ms: float = Field(
        15.0,
        gt=0,
        description="Redis socket timeout of a miss fetch; below triton.timeout_ms, so that a "
        "Redis stall degrades embeddings instead of timing out the whole ranker call.",
    )
    breaker: BreakerSettings = Field(
        BreakerSettings(failures=3, reset_s=1.0),
        description="Open after this many failed Redis reads: misses get default rows at "
        "once (degraded) until a half-open read succeeds.",
    )


class ServerSettings(BaseModel):
    """HTTP server limits (uvicorn + a guarded httptools protocol: services/api/server.py)."""

    max_header_bytes: int = Field(
        16_384, ge=1024, description="Request line + headers larger than this get 431."
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="A connection that has not sent complete headers in time closes."
    )
    keep_alive_s: int = Field(5, ge=1, description="Idle keep-alive connections close after.")
    max_connections: int = Field(
        1000, ge=1, description="Open connections per worker; more are answered 503 and closed."
    )
    graceful_shutdown_s: int = Field(
        10, ge=1, description="On SIGTERM, requests in flight get this long, then are cut."
    )


class FeedbackSettings(BaseModel):
    """The feedback stream in Redis: who may write it, durability, bound, idempotency."""

    keys: list[SecretStr] = Field(
        default_factory=list,
        description="Client keys of POST /v1/feedback (callers send Authorization: Bearer "
        "<key>); several at once while a rotation is under way. JSON list in the environment.",
    )
    keys_file: Path | None = Field(
        None,
        description="A file of client keys, one per line (a mounted secret; read again when "
        "it changes, so a rotation applies without a restart).",
    )
    open: bool = Field(
        False,
        description="Accept feedback without a key (local experiments only; said at start-up "
        "and in /health/ready). With no key configured and this off, feedback is refused.",
    )

    require_durable: bool = Field(
        True,
        description="Refuse to start when the Redis holding feedback does not persist it "
        "(appendonly no); false = start with a warning (acknowledged events may be lost).",
    )
    max_len: int = Field(
        1_000_000, ge=1000, description="Stream bound (XADD MAXLEN ~): oldest events trimmed."
    )
    idempotency_ttl_s: int = Field(
        86_400, ge=60, description="How long an event_id is remembered to drop client retries."
    )


class ImpressionSettings(BaseModel):
    """The impression log: every answer, as the training and KPI source of truth."""

    enabled: bool = Field(True, description="Log every /v1/recommend answer.")
    max_len: int = Field(
        1_000_000, ge=1000, description="Stream bound (XADD MAXLEN ~): oldest sets trimmed."
    )
    attribution_ttl_s: int = Field(
        7 * 86_400,
        ge=60,
        description="How long a request_id resolves to the version that served it.",
    )
    queue: int = Field(
        10_000, ge=10, description="Answers waiting to be logged; beyond, they are dropped."
    )
    batch: int = Field(500, ge=1, description="Most impression sets written in one round trip.")


class FollowSettings(BaseModel):
    """How a gateway follows the desired serving state written by the rollout controller."""

    enabled: bool = Field(
        True, description="Follow the desired state in Redis (or the embedded stack's file)."
    )
    interval_s: float = Field(
        1.0,
        gt=0,
        description="How often the desired state is read and the inference server's versions "
        "are checked and reconciled.",
    )
    keep_previous_s: float = Field(
        600.0, ge=0, description="The previous production stays loaded this long (rollback)."
    )
    retire_after_s: float = Field(
        30.0, ge=0, description="A version no user is routed to is dropped after this long."
    )
    ready_requires_served: bool = Field(
        True,
        description="Readiness (/health/ready) is 503 while this replica's inference server "
        "does not serve the versions it routes users to (after a Triton restart, until the "
        "reconcile loop has loaded them back). false = ready whenever an answer is possible.",
    )


class DriftSettings(BaseModel):
    """Drift statistics and serving KPIs per served version, over a sliding window
    (services/drift/counting.py; reference bins come from each version's drift_reference.json)."""

    enabled: bool = Field(True, description="Count monitored quantities and export drift.")
    window_s: float = Field(
        900.0, ge=10, description="Sliding window the counts, PSI and KPIs cover (seconds)."
    )
    sub_windows: int = Field(
        15, ge=2, le=360, description="Ring slots of the window; it slides by window_s / this."
    )
    export_interval_s: float = Field(
        15.0, gt=0, description="How often PSI, JS distance and KPI gauges are recomputed."
    )
    item_sample: int = Field(
        10,
        ge=1,
        le=1000,
        description="Scored candidates sampled per request for the item-side and score "
        "quantities (each request weighs the same, as in the reference).",
    )


class AdminSettings(BaseModel):
    """The admin endpoints (``POST /v1/admin/alerts``, the Alertmanager webhook): callers send
    ``Authorization: Bearer <token>``. With no token configured they answer 503."""

    token: SecretStr | None = Field(None, description="The bearer token of the admin endpoints.")
    token_file: Path | None = Field(
        None,
        description="A file holding the token (a mounted secret; surrounding whitespace is "
        "ignored; read again when it changes, so a rotated secret applies at once).",
    )

    @model_validator(mode="after")
    def _one_source(self) -> AdminSettings:
        if self.token is not None and self.token_file is not None:
            raise ValueError("admin: set token or token_file, not both")
        return self


class RetrainTriggerSettings(BaseModel):
    """How retraining alerts become retrain requests (the webhook and the queue's worker)."""

    cooldown_s: float = Field(
        21_600.0,
        ge=0,
        description="After a retrain was enqueued, further alerts enqueue nothing for this long.",
    )
    window_s: int = Field(
        3_600,
        ge=60,
        description="Data window of the dedup key: re-sends of one alert group whose firing "
        "started in the same window are one request.",
    )
    dedup_ttl_s: int = Field(
        7 * 86_400, ge=60, description="How long a group key + window is remembered."
    )
    lease_s: float = Field(
        600.0,
        gt=0,
        description="A claimed request whose worker stopped renewing for this long (it died) "
        "is handed to the next worker.",
    )
    queue_file: Path | None = Field(
        None,
        description="Embedded stack only (no Redis): the queue's file; unset = "
        "<artifacts>/retrain/queue.json, beside the retrain job's state.",
    )


class Settings(BaseSettings):
    """Everything the gateway reads at start-up, validated once."""

    model_config = SettingsConfigDict(
        env_prefix="CASCADE_", env_nested_delimiter="__", extra="forbid"
    )

    artifacts: Path = Field(
        Path("artifacts"), description="Export root (releases/, model_repository/)."
    )
    model_version: int | None = Field(None, ge=1, description="Release to serve; unset = latest.")
    canary_version: int | None = Field(None, ge=1, description="Second release for a canary split.")
    canary_percent: float = Field(
        0.0, ge=0, le=100, description="Share of users routed to the canary."
    )
    artifact_fallback: bool = Field(
        True,
        description="When the latest release fails its sha256 check (or a file is missing), "
        "serve the newest older one that verifies (said in the log and readiness details), "
        "and drop a failing canary; false = refuse to start. A pinned model_version is never "
        "replaced.",
    )
    redis: RedisSettings = RedisSettings()
    triton: TritonSettings = TritonSettings()
    embedding_cache: EmbeddingCacheSettings = EmbeddingCacheSettings()
    server: ServerSettings = ServerSettings()
    feedback: FeedbackSettings = FeedbackSettings()
    impressions: ImpressionSettings = ImpressionSettings()
    follow: FollowSettings = FollowSettings()
    drift: DriftSettings = DriftSettings()
    admin: AdminSettings = AdminSettings()
    retrain_trigger: RetrainTriggerSettings = RetrainTriggerSettings()
    streams_dir: Path | None = Field(
        None,
        description="Embedded default only (no Redis): append feedback and impressions as JSON "
        "lines here, so they survive a restart and `cascade retrain` can read them.",
    )
    k_default: int = Field(20, ge=1, le=500)
    k_max: int = Field(500, ge=1, le=500, description="Largest k a request may ask for.")
    candidates: int = Field(300, ge=1, le=5000, description="Retrieval candidate count.")
    neighbor_candidates: int = Field(
        DEFAULT_SHARE,
        ge=0,
        le=5000,
        description="Of the candidates, how many the item-neighbour source may give (the "
        "neighbours of the user's recent items that the ANN did not find; also the whole "
        "candidate set when the query tower cannot answer). 0 = ANN only. A release exported "
        "without the neighbour table is served by the ANN alone.",
    )
    rules_file: Path | None = Field(None, description="YAML ordering rules; unset = no rules.")
    max_body_bytes: int = Field(
        262_144,
        ge=1024,
        description="Requests larger than this get 413 (the largest valid body, 1,000 feedback "
        "events with 64-character event ids, is about 230 KiB).",
    )

    @model_validator(mode="after")
    def _timeouts_nest(self) -> Settings:
        if self.embedding_cache.timeout_ms >= self.triton.timeout_ms:
            raise ValueError(
                f"embedding_cache.timeout_ms ({self.embedding_cache.timeout_ms:g}) must be "
                f"below triton.timeout_ms ({self.triton.timeout_ms:g}): the cache's Redis "
                "reads run inside the ranker call the gateway waits for"
            )
        return self

    def embedded_streams(self) -> Path | None:
        """Where the command line keeps the embedded stack's streams: ``streams_dir``, else
        ``<artifacts>/streams`` when there is no Redis (so ``cascade serve`` and a later
        ``cascade retrain`` meet there with nothing configured); None with a Redis."""
        if self.redis.url:
            return None
        return self.streams_dir or self.artifacts / "streams"

    @model_validator(mode="after")
    def _canary_needs_a_version(self) -> Settings:
        if self.canary_percent > 0 and self.canary_version is None:
            raise ValueError("canary_percent > 0 needs canary_version")
        return self
