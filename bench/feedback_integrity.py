"""Feedback integrity under attack (issue 30): can forged clicks move a canary or a retrain?

On the embedded stack with a private Redis (AOF on), a forced worse candidate (all item
embeddings shuffled) is rolled out against production under simulated users, as in
``bench/rollout.py`` (scenario ``worse``), once without an attacker and once per attack. The
attacker posts forged clicks at 10x the users' real click rate, all for the canary:

- ``no_credential``: no client key (what every client could do before this issue);
- ``stolen_key_no_answer``: a valid key, clicks claiming the canary's version with no
  ``request_id`` or with made-up ones;
- ``replayed_request_ids``: a valid key, the ``request_id`` of real canary answers of other
  users, clicking an item those answers showed, under the attacker's user ids.

Per attack: events sent, forged events the rollout's analysis counted (stored as
``trust=served`` for one of the two arms), forged events a retrain would learn as served
rows (the retrain's own ``vouched_feedback`` over a snapshot of the streams), forged organic
rows left after the caps (and whether the gate's ``holdout.unvouched_share`` check would
fail a retrain on the base data plus these logs), and the rollout's decision against the
one without the attack.
Then the verification's cost, measured against the code it replaced (the version alone per
answer) on the same Redis: CPU per answer logged and per feedback event vouched for, and
Redis memory per answer. Last line: one JSON object (also in
``bench/results/feedback_integrity.json``)::

    .venv/bin/python bench/feedback_integrity.py
    .venv/bin/python bench/feedback_integrity.py --attacks replayed_request_ids --rate 80
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from publish import publish
from rollout import (
    BAD,
    FEEDBACK_KEY,
    GOOD,
    NAMESPACE,
    Stack,
    Traffic,
    exported,
    private_redis,
    rollout,
    served_stack,
    truth,
)

from control.retrain.dataset import combine
from control.retrain.evidence import logged_rows, unvouched_check, vouched_feedback
from control.retrain.snapshot import read_since
from control.validation.config import LoggedEvents
from pipelines.data.schema import RawDataset
from services.events.attribution import SERVED, vouch
from services.stores.base import Answer
from services.stores.redis import RedisStore

ATTACKS = ("no_credential", "stolen_key_no_answer", "replayed_request_ids")
FORGED_PER_REAL = 10  # forged clicks per real click
BATCH = 200  # forged events per post


@dataclass
class Forged:
    """What one attacker sent and what the gateway answered."""

    sent: int = 0
    statuses: Counter[int] = field(default_factory=Counter)  # events per HTTP status
    ids: set[str] = field(default_factory=set)  # stream ids of the events stored


def forged_events(
    kind: str, count: int, traffic: Traffic, canary: int, rng: np.random.Generator
) -> list[dict[str, Any]]:
    """``count`` forged clicks of one attack, all in favour of the canary."""
    if kind == "replayed_request_ids":
        answers = [rid for rid, version in traffic.answers.items() if version == canary]
        events = []
        for request_id in rng.choice(answers, min(count, len(answers)), replace=True):
            user_id, items = traffic.shown[str(request_id)]
            events.append(
                {
                    "user_id": int(user_id) + 1,  # someone else's answer
                    "item_id": int(items[0]),
                    "type": "click",
                    "request_id": str(request_id),
                }
            )
        return events
    shown = [item for _, items in list(traffic.shown.values())[-200:] for item in items]
    return [
        {
            "user_id": int(rng.integers(1, 1000)),
            "item_id": int(rng.choice(shown)),
            "type": "click",
            "model_version": canary,
            # half claim an answer that was never given
            **({"request_id": secrets.token_hex(16)} if n % 2 and kind != "no_credential" else {}),
        }
        for n in range(count)
    ]


def attacker(stack: Stack, kind: str, canary: int, forged: Forged) -> Any:
    """The coroutine ``rollout`` runs beside the users: keeps the forged clicks at
    FORGED_PER_REAL times the clicks the users posted so far."""
    headers = {} if kind == "no_credential" else {"Authorization": f"Bearer {FEEDBACK_KEY}"}
    rng = np.random.default_rng(7)

    async def run(stop: asyncio.Event, traffic: Traffic) -> None:
        async with httpx.AsyncClient(
            base_url=stack.gateway_url, headers=headers, timeout=10.0
        ) as http:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.25)
                due = FORGED_PER_REAL * traffic.clicks - forged.sent
                while due > 0 and traffic.shown:
                    events = forged_events(kind, min(BATCH, due), traffic, canary, rng)
                    if not events:
                        break
                    answer = await http.post("/v1/feedback", json={"events": events})
                    forged.sent += len(events)
                    forged.statuses[answer.status_code] += len(events)
                    if answer.status_code == 200:
                        forged.ids.update(answer.json()["ids"])
                    due -= len(events)

    return run


async def what_the_loop_saw(
    redis_url: str, since: str, forged: Forged, arms: tuple[int, int], base: RawDataset
) -> dict[str, Any]:
    """Forged events the analysis counts (served, for an arm) and a retrain would learn,
    and what the gate's ``holdout.unvouched_share`` check says of a retrain on ``base``
    plus these logs."""
    store = RedisStore(redis_url, NAMESPACE)
    await store.start()
    try:
        snapshot = await read_since(store, {"feedback": since, "impressions": since})
        stored = {
            stream_id: fields
            for stream_id, fields in await store.read_stream("feedback", since, 10**7)
        }
    finally:
        await store.close()
    in_kpis = sum(
        1
        for stream_id in forged.ids
        if stored.get(stream_id, {}).get("trust") == SERVED
        and stored[stream_id].get("type") == "click"
        and int(stored[stream_id].get("model_version") or -1) in arms
    )
    kept, _ = vouched_feedback(snapshot.feedback, snapshot.impressions)
    is_forged = kept["stream_id"].isin(forged.ids)
    served_rows = int((is_forged & (kept["trust"] == SERVED)).sum())
    # organic rows a retrain keeps after the caps: with and without the forged events
    config = LoggedEvents()
    with_forged, _, _ = logged_rows(snapshot.feedback, snapshot.impressions, config)
    without = snapshot.feedback[~snapshot.feedback["stream_id"].isin(forged.ids)]
    honest, _, _ = logged_rows(without, snapshot.impressions, config)
    organic = int((~with_forged["served"]).sum() - (~honest["served"]).sum())
    trust = Counter(stored[i].get("trust", "") for i in forged.ids if i in stored)
    check = unvouched_check(combine(base, with_forged), config)
    return {
        "holdout_unvouched_share": round(float(check.value or 0.0), 3),
        "gate_unvouched_check": "pass" if check.passed else "FAIL",
        "forged_counted_in_kpis": in_kpis,
        "forged_in_training_rows": served_rows,
        "forged_organic_rows_after_caps": organic,
        "forged_stored_by_trust": dict(trust),
    }


async def verification_cost(redis_url: str, answers: int = 20_000, k: int = 20) -> dict:
    """CPU of the gateway's side of logging an answer and vouching for a click, the trusted
    way against the code it replaced (only the version per request), on the same Redis;
    and Redis memory per remembered answer."""
    store = RedisStore(redis_url, "costbench")
    await store.start()
    client = store.client
    rng = np.random.default_rng(0)
    records = [
        {
            "request_id": secrets.token_hex(16),
            "user_id": str(int(rng.integers(1, 10**6))),
            "model_version": "3",
            "items": " ".join(map(str, rng.integers(1, 10**6, k))),
        }
        for _ in range(answers)
    ]

    async def write(trusted: bool) -> float:
        started = time.process_time()
        for start in range(0, answers, 500):
            pipe = client.pipeline(transaction=False)
            for record in records[start : start + 500]:
                if trusted:
                    value = Answer.of_impression(record).encode()
                    pipe.set(store.key("answer", record["request_id"]), value, ex=600)
                else:
                    pipe.set(store.key("served", record["request_id"]), "3", ex=600)
            await pipe.execute()
        return (time.process_time() - started) / answers * 1e6

    async def read(trusted: bool, per_post: int = 10) -> float:
        started = time.process_time()
        for start in range(0, answers, per_post):
            batch = records[start : start + per_post]
            ids = [r["request_id"] for r in batch]
            if trusted:
                found = await store.answers(ids)
                for record, answer in zip(batch, found, strict=True):
                    item = record["items"].split()[0]
                    vouch(record["user_id"], item, record["request_id"], answer)
            else:
                raw = await client.mget([store.key("served", r) for r in ids])
                [None if v is None else int(v) for v in raw]
        return (time.process_time() - started) / answers * 1e6

    try:
        figures: dict[str, Any] = {}
        for _ in range(2):  # the second round is the one reported (warm connections)
            figures = {
                "per_answer_cpu_us": {"before": await write(False), "after": await write(True)},
                "per_event_cpu_us": {"before": await read(False), "after": await read(True)},
            }
        old = await client.memory_usage(store.key("served", records[0]["request_id"]))
        new = await client.memory_usage(store.key("answer", records[0]["request_id"]))
        figures["redis_bytes_per_answer"] = {"before": old, "after": new, "items_per_answer": k}
        for name in ("per_answer_cpu_us", "per_event_cpu_us"):
            pair = figures[name]
            pair["before"], pair["after"] = round(pair["before"], 1), round(pair["after"], 1)
            pair["added"] = round(pair["after"] - pair["before"], 1)
            pair["ratio"] = round(pair["after"] / pair["before"], 2)
        await client.flushdb()  # only this bench's keys live in the private Redis's db
        return figures
    finally:
        await store.close()


async def run_all(directory: Path, attacks: tuple[str, ...], rate: float) -> dict[str, Any]:
    started = time.monotonic()
    root = await exported(directory)
    dataset = truth()
    results: dict[str, Any] = {}
    with private_redis(directory) as redis_url:
        with served_stack(root, redis_url, rate, dataset) as stack:
            baseline = await rollout(stack, GOOD, BAD, force=True)
            without = f"{baseline['outcome']}:{baseline['reason']}"
            print(f"without an attack: {without} after {baseline['time_to_decision_s']} s")
            for kind in attacks:
                forged = Forged()
                since = f"{int(time.time() * 1000)}-0"
                run = await rollout(
                    stack, GOOD, BAD, force=True, beside=attacker(stack, kind, BAD, forged)
                )
                await asyncio.sleep(1.0)  # the impression writer's last batch
                seen = await what_the_loop_saw(redis_url, since, forged, (GOOD, BAD), dataset)
                real_clicks = sum(arm["clicks"] for arm in run["arms"].values())
                results[kind] = {
                    "forged_sent": forged.sent,
                    "forged_http_statuses": {str(s): n for s, n in forged.statuses.items()},
                    **seen,
                    "real_clicks_counted": real_clicks,
                    "decision": f"{run['outcome']}:{run['reason']}",
                    "decision_without_attack": without,
                    "time_to_decision_s": run["time_to_decision_s"],
                    "canary_ctr": run["arms"].get("canary", {}).get("ctr"),
                    "baseline_canary_ctr": baseline["arms"].get("canary", {}).get("ctr"),
                }
                print(f"{kind}: {results[kind]}", flush=True)
        cost = await verification_cost(redis_url)
        print(f"verification cost: {cost}", flush=True)
    targets_met = all(
        r["forged_counted_in_kpis"] == 0
        and r["forged_in_training_rows"] == 0
        and r["decision"] == r["decision_without_attack"]
        for r in results.values()
    )
    return {
        "attacks": results,
        "forged_per_real_click": FORGED_PER_REAL,
        "rate_per_s": rate,
        "verification_cost": cost,
        "targets_met": targets_met,
        "wall_s": round(time.monotonic() - started, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--attacks", default=",".join(ATTACKS), help="attacks, comma-separated (default: all)"
    )
    parser.add_argument(
        "--rate", type=float, default=120.0, help="simulated requests per second (default 120)"
    )
    parser.add_argument(
        "--workdir", type=Path, default=None, help="keep (and reuse) the trained export here"
    )
    args = parser.parse_args()
    attacks = tuple(a for a in args.attacks.split(",") if a)
    unknown = set(attacks) - set(ATTACKS)
    if unknown:
        parser.error(f"unknown attacks {sorted(unknown)}; choose from {ATTACKS}")
    if not args.rate > 0:
        parser.error(f"--rate must be > 0, got {args.rate}")
    with contextlib.ExitStack() as cleanup:
        directory = args.workdir or Path(
            cleanup.enter_context(tempfile.TemporaryDirectory(prefix="cascade-integrity-"))
        )
        directory.mkdir(parents=True, exist_ok=True)
        record = asyncio.run(run_all(directory, attacks, args.rate))
    publish("feedback_integrity", record)
    return 0 if record["targets_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
