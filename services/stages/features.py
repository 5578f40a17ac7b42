"""Features stage: the user's record, recent history, seen set and the unavailable items,
in one pipelined store round trip."""

from __future__ import annotations

from collections.abc import Callable

from services.errors import DependencyUnavailable
from services.serving.context import RequestContext
from services.stores.base import OnlineStore
from services.util.resilience import CircuitBreaker


class FeaturesStage:
    name = "features"

    def __init__(
        self,
        store: OnlineStore,
        breaker: CircuitBreaker,
        timeout_s: float,
        on_store_empty: Callable[[], None] = lambda: None,
    ) -> None:
        self.store = store
        self.breaker = breaker
        self.timeout_s = timeout_s
        self.on_store_empty = on_store_empty

    async def __call__(self, ctx: RequestContext) -> RequestContext:
        try:
            found = await self.breaker.call(lambda: self.store.lookup(ctx.user_id), self.timeout_s)
        except DependencyUnavailable as error:
            ctx.degrade(self.name, error.reason)  # served as a cold start from here on
            return ctx
        if not found.loaded:  # lost its data: a missing user may be a known one
            ctx.degrade(self.name, "store_empty")
            self.on_store_empty()
        ctx.user, ctx.unavailable = found.user, found.unavailable
        return ctx
