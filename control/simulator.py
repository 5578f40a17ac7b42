"""Synthetic users driving a running gateway, clicking by a ground truth.

Each simulated request asks ``/v1/recommend`` for a user of the population, then clicks each
shown item with probability ``position_bias(rank) * relevance(user, item)``, where relevance
comes from a preference model no trained model sees directly:

- MovieLens-100K: the user's own rating of the item where there is one; for an item the user
  never rated (everything a release shows: it filters every rated item, held-out ones
  included), the rating a low-rank completion of *all* ratings predicts
  (``pipelines.data.rating_completion``), times ``UNRATED_INTEREST`` (nothing says the user
  would even look at it). A constant for unrated items, as before, made every click noise:
  0 of 90,000 items shown were rated, CTR 0.0091 = 0.02 x the mean position bias;
- the synthetic generator: its hidden latent affinity (``RawDataset.truth``).

Clicks are posted to ``/v1/feedback`` with the answer's ``request_id`` (so the gateway
attributes them) and an ``event_id`` (so retries are harmless). A post of either route that
gets a 503 (feedback: the gateway could not store it durably in time) or no answer (a
connection dropped) is retried, a few times with a short backoff, as a production client
would; idle connections are closed by the client well before the gateway's keep-alive ends,
so the client never sends on a connection the server is closing. Requests go out at a fixed
rate for a fixed time, at most ``max_requests``, bounded concurrency; it stops by itself and
reports impressions, clicks, CTR and hit rate per model version.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipelines.data.schema import RawDataset

# MovieLens, an item the user never rated: this share of the relevance its predicted rating
# gives (a random such item gets about 0.026, production's top 10 about 0.056)
UNRATED_INTEREST = 0.1
POPULATIONS = ("all", "young", "old", "heavy", "new")
NEW_USERS = 1000  # size of the "new" population: ids no release knows (cold starts)
ATTEMPTS = 4  # a post is sent at most this many times
BACKOFF_S = 0.1  # before the first retry; doubled before each further one
KEEPALIVE_S = 1.0  # an idle connection is closed after this (the gateway's keep-alive: 5 s)


class Preferences:
    """relevance(user, items) in [0, 1] from a dataset's ground truth, vectorised."""

    def __init__(self, dataset: RawDataset, sharpness: float = 2.0) -> None:
        from pipelines.data.rating_completion import fit_rating_completion

        self.truth = dataset.truth
        self.sharpness = sharpness
        ratings = dataset.interactions
        self.completion = fit_rating_completion(ratings) if self.truth is None else None
        self._index = (
            {
                (int(u), int(i)): float(r)
                for u, i, r in zip(
                    ratings["user_id"].to_numpy(),
                    ratings["item_id"].to_numpy(),
                    ratings["rating"].to_numpy(),
                    strict=True,
                )
            }
            if self.truth is None
            else {}
        )

    def relevance(self, user_id: int, item_ids: np.ndarray) -> np.ndarray:
        if self.truth is not None:
            affinity = self.truth.affinity(np.full(len(item_ids), user_id), item_ids)
            return 1.0 / (1.0 + np.exp(-self.sharpness * (affinity - 1.0)))
        assert self.completion is not None
        ratings = np.asarray([self._index.get((user_id, int(i)), np.nan) for i in item_ids])
        unrated = np.isnan(ratings)
        predicted = self.completion.predict(np.full(len(item_ids), user_id), item_ids)
        ratings = np.where(unrated, predicted, ratings)
        relevance = 1.0 / (1.0 + np.exp(-self.sharpness * (ratings - 4.0)))
        return np.where(unrated, UNRATED_INTEREST * relevance, relevance)


def position_bias(count: int) -> np.ndarray:
    """How likely a user looks at rank r (1-based): 1 / log2(r + 1)."""
    return 1.0 / np.log2(np.arange(count) + 2.0)


def population(dataset: RawDataset, name: str) -> np.ndarray:
    """User ids of a population: everyone, or a shift for drift scenarios: a demographic one
    (young, old), the most active tenth of the users (heavy: activity and history length
    move), or users no model has seen (new: cold starts, unknown attributes)."""
    users = dataset.users
    if name == "new":
        first = int(users["user_id"].max()) + 1
        return np.arange(first, first + NEW_USERS, dtype=np.int64)
    if name == "heavy":
        activity = dataset.interactions["user_id"].value_counts()
        return activity.index[: max(1, len(activity) // 10)].to_numpy(np.int64)
    if name == "all":
        chosen = users
    elif name == "young":
        chosen = users[users["age"] < 30]
    elif name == "old":
        chosen = users[users["age"] >= 50]
    else:
        raise ValueError(f"unknown population {name!r}; one of {POPULATIONS}")
    return chosen["user_id"].to_numpy(np.int64)


@dataclass
class Tally:
    """What one model version got: answers, items shown, clicks, answers with a click."""

    requests: int = 0
    impressions: int = 0
    clicks: int = 0
    hits: int = 0

    def as_dict(self) -> dict[str, float]:
        return {
            "requests": self.requests,
            "impressions": self.impressions,
            "clicks": self.clicks,
            "ctr": round(self.clicks / self.impressions, 5) if self.impressions else 0.0,
            "hit_rate": round(self.hits / self.requests, 5) if self.requests else 0.0,
        }


@dataclass
class Report:
    per_version: dict[int, Tally] = field(default_factory=lambda: defaultdict(Tally))
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    degraded: int = 0
    seconds: float = 0.0
    shifted: int = 0  # requests sent for the shifted population
    retries: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # by route

    def as_dict(self) -> dict:
        return {
            "versions": {str(v): t.as_dict() for v, t in sorted(self.per_version.items())},
            "errors": self.errors,
            "error_kinds": dict(sorted(self.error_kinds.items())),
            "shifted": self.shifted,
            "retries": dict(sorted(self.retries.items())),
            "degraded": self.degraded,
            "seconds": round(self.seconds, 2),
        }

    def table(self) -> str:
        lines = [
            f"{'version':>7}  {'requests':>8}  {'shown':>7}  {'clicks':>6}  "
            f"{'ctr':>7}  {'hit rate':>8}"
        ]
        for version, tally in sorted(self.per_version.items()):
            row = tally.as_dict()
            lines.append(
                f"{version:>7}  {row['requests']:>8}  {row['impressions']:>7}  "
                f"{row['clicks']:>6}  {row['ctr']:>7.4f}  {row['hit_rate']:>8.4f}"
            )
        kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(self.error_kinds.items()))
        lines.append(
            f"errors {self.errors}{f' ({kinds})' if kinds else ''}, "
            f"retries {sum(self.retries.values())}, "
            f"degraded answers {self.degraded}, {self.seconds:.1f} s"
        )
        return "\n".join(lines)


@dataclass
class SimulationPlan:
    url: str = "http://127.0.0.1:8080"
    rate: float = 20.0  # requests per second
    duration_s: float = 30.0
    max_requests: int = 100_000
    k: int = 10
    concurrency: int = 16
    seed: int = 0
    timeout_s: float = 5.0
    attempts: int = ATTEMPTS  # of each post (retries after a 503 or no answer)
    shift_at_s: float | None = None  # from then on, users come from the shifted population
    # sent as Authorization: Bearer <key> with every post
    feedback_key: str | None = field(
        default_factory=lambda: os.environ.get("CASCADE_FEEDBACK_KEY", "").strip() or None
    )


async def simulate(
    plan: SimulationPlan,
    users: np.ndarray,
    preferences: Preferences,
    progress: Callable[[str], None] = lambda _: None,
    shifted: np.ndarray | None = None,
    transport: Any = None,
) -> Report:
    """Drive the gateway at ``plan.rate`` for ``plan.duration_s`` (bounded); return the tally.

    With ``plan.shift_at_s`` and ``shifted``, requests scheduled at or after that many
    seconds draw their users from ``shifted`` instead of ``users`` (a population shift).
    ``transport`` replaces httpx's network transport (tests)."""
    import httpx  # the client: imported here so `cascade` starts without the serving extra

    if len(users) == 0:
        raise ValueError("the population has no users")
    if (plan.shift_at_s is None) != (shifted is None):
        raise ValueError("a population shift needs both shift_at_s and the shifted users")
    if shifted is not None and len(shifted) == 0:
        raise ValueError("the shifted population has no users")
    if plan.attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {plan.attempts}")
    shift_at = np.inf if plan.shift_at_s is None else plan.shift_at_s
    rng = np.random.default_rng(plan.seed)
    report = Report()
    gate = asyncio.Semaphore(plan.concurrency)
    started = time.monotonic()
    deadline = started + plan.duration_s
    total = min(plan.max_requests, max(1, int(plan.rate * plan.duration_s)))
    bias = position_bias(plan.k)

    async def post(http: Any, route: str, body: dict) -> Any:
        """POST ``body`` to ``/v1/<route>``; retry a 503 or a transport error; return the
        first other answer, or raise what the last attempt got."""
        backoff_s = BACKOFF_S
        for _ in range(plan.attempts - 1):
            try:
                answer = await http.post(f"/v1/{route}", json=body)
                if answer.status_code != 503:
                    return answer.raise_for_status()
            except httpx.TransportError:
                pass
            report.retries[route] += 1
            await asyncio.sleep(backoff_s)
            backoff_s *= 2
        return (await http.post(f"/v1/{route}", json=body)).raise_for_status()

    async def one(http: Any, user_id: int, draws: np.ndarray) -> None:
        async with gate:
            route = "recommend"
            try:
                answer = await post(http, route, {"user_id": user_id, "k": plan.k})
                body = answer.json()
                items = np.asarray([i["item_id"] for i in body["items"]], np.int64)
                version = int(body["model_versions"]["release"])
                clicked = items[
                    draws[: len(items)] < bias[: len(items)] * preferences.relevance(user_id, items)
                ]
                tally = report.per_version[version]
                tally.requests += 1
                tally.impressions += len(items)
                tally.clicks += len(clicked)
                tally.hits += int(len(clicked) > 0)
                report.degraded += int(bool(body["degraded"]))
                if len(clicked):
                    events = [
                        {
                            "user_id": user_id,
                            "item_id": int(item),
                            "type": "click",
                            "request_id": body["request_id"],
                            "event_id": f"sim-{body['request_id']}-{int(item)}",
                        }
                        for item in clicked
                    ]
                    route = "feedback"
                    await post(http, route, {"events": events})
            except (httpx.HTTPError, ValueError, KeyError) as error:
                report.errors += 1
                status = getattr(getattr(error, "response", None), "status_code", None)
                report.error_kinds[f"{route} {status or type(error).__name__}"] += 1

    async with httpx.AsyncClient(
        base_url=plan.url,
        timeout=plan.timeout_s,
        limits=httpx.Limits(keepalive_expiry=KEEPALIVE_S),
        transport=transport,
        headers={"Authorization": f"Bearer {plan.feedback_key}"} if plan.feedback_key else None,
    ) as http:
        tasks = []
        for number in range(total):
            at = started + number / plan.rate
            if at >= deadline:
                break
            delay = at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            pool = users
            if number / plan.rate >= shift_at and shifted is not None:
                pool = shifted
                if report.shifted == 0:
                    progress(f"simulate: population shifted after {number} requests")
                report.shifted += 1
            user_id = int(pool[rng.integers(len(pool))])
            tasks.append(asyncio.create_task(one(http, user_id, rng.random(plan.k))))
            if number and number % max(1, int(plan.rate * 5)) == 0:
                progress(f"simulate: {number} requests sent, {report.errors} errors")
        await asyncio.gather(*tasks)
    report.seconds = time.monotonic() - started
    return report


def report_json(report: Report) -> str:
    return json.dumps(report.as_dict(), sort_keys=True)
