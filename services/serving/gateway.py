"""Assembles the serving system from settings: store, inference backend, releases, stages.

Nothing connects in the constructor; ``start()`` loads and connects (driven by the FastAPI
lifespan), ``close()`` releases. ``recommend`` is where every caller (the HTTP route, the JSON
fast path, batch jobs) hands over a request: it translates the data set's ids to the serving
release's internal ids there, and the answer's back, once (``services.serving.ids``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import numpy as np

from core.ids import ExternalId
from services.drift.counting import DriftMonitor
from services.errors import FeedbackNotDurable, NotReady
from services.events.impressions import ImpressionLog
from services.inference.backends import InferenceBackend, LocalBackend
from services.metrics import UNKNOWN_EXCLUDE_ITEMS
from services.serving.context import RequestContext
from services.serving.ids import ReleaseIds
from services.serving.recommender import Recommender
from services.serving.release import Release, load_served_releases
from services.serving.routing import VersionRouter
from services.serving.rules import Rules, load_rules
from services.settings import Settings
from services.stages.features import FeaturesStage
from services.stages.filtering import FilteringStage
from services.stages.ordering import OrderingStage
from services.stages.retrieval import RetrievalStage
from services.stages.scoring import ScoringStage
from services.state.desired_state import DesiredState, make_desired_state_store
from services.state.follower import StateFollower
from services.stores.base import Durability, OnlineStore
from services.stores.materialize import materialize
from services.stores.memory import InMemoryStore
from services.stores.monitor import StoreMonitor
from services.stores.redis import RedisStore
from services.util.resilience import CircuitBreaker

log = logging.getLogger(__name__)


def make_store(settings: Settings) -> OnlineStore:
    if settings.redis.url:
        return RedisStore(settings.redis.url, settings.redis.namespace, settings.redis.durable_url)
    return InMemoryStore(settings.streams_dir)


def make_backend(settings: Settings) -> InferenceBackend:
    if settings.triton.url:
        from services.inference.backends import QUERY_TOWER, RANKER
        from services.inference.placement import PlacedBackend
        from services.inference.triton import TritonBackend

        key = settings.triton.control_key
        on_triton = settings.triton.query_tower == "triton"
        triton = TritonBackend(
            settings.triton.url,
            settings.triton.protocol,
            key.get_secret_value() if key is not None else None,
            settings.artifacts / "model_repository",
            models=(QUERY_TOWER, RANKER) if on_triton else (RANKER,),
        )
        if on_triton:
            return triton
        query = LocalBackend(settings.artifacts / "model_repository", settings, (QUERY_TOWER,))
        return PlacedBackend(query, triton)
    return LocalBackend(settings.artifacts / "model_repository", settings)


class Gateway:
    """Everything one gateway process serves with."""

    def __init__(
        self,
        settings: Settings,
        store: OnlineStore | None = None,
        backend: InferenceBackend | None = None,
    ) -> None:
        self.settings = settings
        self.store = store or make_store(settings)
        self.backend = backend or make_backend(settings)
        self.releases: dict[int, Release] = {}
        self.release_problems: list[str] = []  # releases asked for but refused (corrupted...)
        self.rules: Rules = Rules()
        self.router: VersionRouter | None = None
        self.redis_breaker = CircuitBreaker("redis", settings.redis.breaker)
        self.triton_breaker = CircuitBreaker("triton", settings.triton.breaker)
        self.recommender: Recommender | None = None
        self.store_monitor: StoreMonitor | None = None
        self.impressions: ImpressionLog | None = None
        self.follower: StateFollower | None = None
        self.drift = DriftMonitor(settings.drift, settings.artifacts, lambda: self.releases)

    @property
    def ready(self) -> bool:
        return self.recommender is not None

    async def start(self) -> None:
        settings = self.settings
        self.rules = load_rules(settings.rules_file)
        desired = await self._desired_at_start()
        pinned, canary = settings.model_version, settings.canary_version
        percent, salt = settings.canary_percent, ""
        if desired is not None:  # the rollout's state wins over the newest export
            pinned, canary, percent = desired.production, desired.canary, desired.weight_percent
            salt = desired.assignment_salt
        served = await asyncio.to_thread(  # verifies every file's sha256: not on the loop
            load_served_releases,
            settings.artifacts,
            pinned,
            canary,
            settings.artifact_fallback,
            self.rules,
        )
        self.releases.update(served.releases)
        self.release_problems = served.problems
        default = served.releases[served.default]
        self.router = VersionRouter(default.version, served.canary, percent, salt)
        await self.store.start()
        release_dir = settings.artifacts / "releases" / str(default.version)
        if isinstance(self.store, InMemoryStore):  # the embedded default starts empty
            count = await materialize(self.store, release_dir)
            log.info("in-memory store loaded with %d users", count)
        self.store_monitor = StoreMonitor(self.store, release_dir, settings.redis.auto_materialize)
        await self.store_monitor.check()
        self._check_durability(self.store_monitor.durability)
        self.store_monitor.start()
        self.impressions = ImpressionLog(self.store, settings.impressions)
        self.impressions.start()
        await self.backend.start(sorted(self.releases))
        await self.warm_up(sorted(self.releases))
        if self.follower is not None:
            if desired is not None:
                self.follower.applied_revision = desired.revision
            self.follower.start()
        await self.drift.start()
        redis_s, triton_s = settings.redis.timeout_ms / 1000, settings.triton.timeout_ms / 1000
        self.recommender = Recommender(
            [
                FeaturesStage(
                    self.store, self.redis_breaker, redis_s, self.store_monitor.notice_empty
                ),
                RetrievalStage(
                    self.releases,
                    self.backend,
                    self.triton_breaker,
                    triton_s,
                    settings.candidates,
                    settings.neighbor_candidates,
                ),
                FilteringStage(self.releases),
                ScoringStage(
                    self.releases,
                    self.backend,
                    self.triton_breaker,
                    triton_s,
                    self.drift.observe_scored,
                ),
                OrderingStage(self.releases),
            ]
        )

    async def warm_up(self, versions: list[int]) -> None:
        """One untimed call to each model of each version before serving, so the first user
        does not pay for lazy imports and cold caches. A failure is logged, not raised: the
        requests that follow degrade as usual."""
        for version in versions:
            release = self.releases[version]
            ctx = RequestContext(user_id=0, k=1, timestamp=int(time.time()), model_version=version)
            ctx.candidates = release.popularity[: self.settings.candidates]
            sparse, dense = release.features.ranking_inputs(ctx)
            try:
                await asyncio.wait_for(
                    self.backend.encode_query(
                        version,
                        np.zeros((1, len(release.workflow.schema.user_tower_columns)), np.int64),
                        np.zeros((1, release.features.history_length), np.int64),
                    ),
                    30,
                )
                await asyncio.wait_for(self.backend.rank(version, sparse, dense), 30)
            except Exception as error:
                log.warning("warm-up of model version %d failed: %r", version, error)

    def _check_durability(self, durability: Durability | None) -> None:
        """Refuse to start on a store that loses acknowledged feedback on a restart, unless
        the settings accept that (then warn). Unknown (store unreachable now): the feedback
        route refuses events until the monitor has seen a durable store."""
        if durability is None or durability.durable:
            if durability is not None:
                log.info("feedback store: %s", durability.detail)
            return
        if isinstance(self.store, InMemoryStore):
            log.warning("feedback is kept in process memory (embedded default, no Redis)")
        elif self.settings.feedback.require_durable:
            raise FeedbackNotDurable(
                f"the Redis holding feedback does not persist it ({durability.detail}): "
                "turn on AOF (appendonly yes in redis.conf, or CONFIG SET appendonly yes) or "
                "set CASCADE_FEEDBACK__REQUIRE_DURABLE=false to accept losing events"
            )
        else:
            log.warning(
                "feedback store: %s (CASCADE_FEEDBACK__REQUIRE_DURABLE=false)", durability.detail
            )

    def release_ids(self, version: int | None) -> ReleaseIds:
        """The id maps of ``version`` when this gateway holds it, else the production
        version's (the identity before a release is loaded)."""
        if version not in self.releases and self.router is not None:
            version = self.router.default
        release = self.releases.get(version) if version is not None else None
        return release.ids if release is not None else ReleaseIds.identity()

    @property
    def feedback_refusal(self) -> str | None:
        """Why feedback cannot be acknowledged as durable right now (None: it can)."""
        monitor = self.store_monitor
        if isinstance(self.store, InMemoryStore) or not self.settings.feedback.require_durable:
            return None
        if monitor is None or monitor.durability is None:
            return "the feedback store has not been checked for durability yet"
        if not monitor.durability.durable:
            return f"the feedback store does not persist events ({monitor.durability.detail})"
        return None

    async def _desired_at_start(self) -> DesiredState | None:
        """The desired state when following is on and one was written (else None)."""
        settings = self.settings
        if not settings.follow.enabled:
            return None
        store = make_desired_state_store(
            settings.redis.durable, settings.redis.namespace, settings.artifacts
        )
        self.follower = StateFollower(
            self,
            store,
            settings.follow.interval_s,
            settings.follow.keep_previous_s,
            settings.follow.retire_after_s,
        )
        return await self.follower.read()

    async def close(self) -> None:
        self.recommender = None
        await self.drift.close()
        if self.follower is not None:
            await self.follower.close()
        if self.store_monitor is not None:
            await self.store_monitor.close()
        if self.impressions is not None:
            await self.impressions.close()
        await self.backend.close()
        await self.store.close()

    async def recommend(
        self,
        user_id: ExternalId,
        k: int,
        context: dict,
        exclude: Sequence[ExternalId],
        model_version: int | None,
        at: int | None = None,
    ) -> tuple[RequestContext, Release]:
        """Recommend ``k`` items for ``user_id``; ids are the data set's own. The context
        works in the release's internal ids; ``external_item_ids`` is the answer as the data
        set names it. A user the release does not know is served as a cold start; excluded
        items it does not know are ignored (counted). ``at``: the request's unix time (a
        batch for a campaign sent later; default now)."""
        if self.recommender is None or self.router is None:
            raise NotReady("no release is loaded")
        version, split = self.router.assign(user_id, model_version)
        release = self.releases[version]
        excluded = release.ids.items.to_internal(exclude)
        known = excluded[release.positions(excluded) >= 0] if len(excluded) else excluded
        if len(known) < len(excluded):
            UNKNOWN_EXCLUDE_ITEMS.inc(len(excluded) - len(known))
        ctx = RequestContext(
            user_id=release.ids.users.one(user_id),
            k=k,
            timestamp=int(time.time()) if at is None else at,
            model_version=version,
            split=split,
            context=dict(context),
            exclude=known,
            external_user_id=user_id,
        )
        ctx = await self.recommender(ctx)
        ctx.external_item_ids = release.ids.items.to_external(release.item_ids[ctx.candidates])
        self.drift.observe_served(ctx)
        return ctx, release
