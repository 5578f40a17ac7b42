"""The simulator posts as a production client would: a 503 (feedback: the gateway could not
store it durably in time) or a dropped connection is retried, clicks with the same event ids;
what still fails after the last attempt is an error of the run."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import numpy as np
import pytest

from control.simulator import Preferences, Report, SimulationPlan, simulate


class AlwaysRelevant(Preferences):
    """Every item is relevant: the top-ranked one is always clicked, so every answer posts
    feedback."""

    def __init__(self) -> None:  # no data set needed
        pass

    def relevance(self, user_id: int, item_ids: np.ndarray) -> np.ndarray:
        return np.ones(len(item_ids))


class Gateway:
    """A stand-in gateway: every user gets items 1..k; feedback (and recommend) answer from
    a script of statuses (then 200), 0 meaning the connection drops."""

    def __init__(self, feedback_script: list[int], recommend_script: tuple[int, ...] = ()) -> None:
        self.script = list(feedback_script)
        self.recommend_script = list(recommend_script)
        self.feedback_bodies: list[list[str]] = []
        self.calls: Counter[str] = Counter()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls[request.url.path] += 1
        if request.url.path == "/v1/recommend":
            if self.recommend_script and self.recommend_script.pop(0) == 0:
                raise httpx.ReadError("connection closed by the server", request=request)
            items = [{"item_id": i, "score": 1.0 / i} for i in range(1, 11)]
            return httpx.Response(
                200,
                json={
                    "items": items,
                    "request_id": f"r{self.calls['/v1/recommend']}",
                    "model_versions": {"release": 1},
                    "degraded": False,
                },
            )
        body = request.read().decode()
        self.feedback_bodies.append(sorted(e for e in body.split('"event_id":"')[1:]))
        status = self.script.pop(0) if self.script else 200
        if status == 0:
            raise httpx.ConnectError("connection dropped", request=request)
        return httpx.Response(status, json={"stored": 1, "duplicates": 0, "ids": ["1-0"]})


def run(gateway: Gateway, requests: int = 30, attempts: int = 4) -> Report:
    plan = SimulationPlan(
        url="http://gateway.test",
        rate=1000,
        duration_s=requests / 1000,
        k=10,
        concurrency=1,
        seed=1,
        attempts=attempts,
    )
    users = np.arange(1, 51, dtype=np.int64)
    transport = httpx.MockTransport(gateway)
    return asyncio.run(simulate(plan, users, AlwaysRelevant(), transport=transport))


def test_a_503_or_a_dropped_connection_is_retried_with_the_same_events() -> None:
    gateway = Gateway([503, 0, 503])
    report = run(gateway)
    assert report.errors == 0
    assert report.retries["feedback"] == 3
    # the first post and its three retries carried the same event ids
    assert gateway.feedback_bodies[0] == gateway.feedback_bodies[3]
    assert gateway.calls["/v1/feedback"] == gateway.calls["/v1/recommend"] + 3


def test_feedback_still_refused_after_the_last_attempt_is_an_error() -> None:
    gateway = Gateway([503] * 4)
    report = run(gateway, attempts=4)
    assert report.errors == 1
    assert report.error_kinds == {"feedback 503": 1}
    assert report.retries["feedback"] == 3


def test_a_client_error_is_not_retried() -> None:
    gateway = Gateway([422])
    report = run(gateway)
    assert report.errors == 1 and report.retries["feedback"] == 0


def test_at_least_one_attempt() -> None:
    with pytest.raises(ValueError, match="attempts"):
        run(Gateway([]), attempts=0)


def test_a_recommend_whose_connection_dropped_is_sent_again() -> None:
    gateway = Gateway([], recommend_script=[0])
    report = run(gateway)
    assert report.errors == 0 and report.retries == {"recommend": 1}
    assert sum(t.requests for t in report.per_version.values()) == 30  # every answer counted
