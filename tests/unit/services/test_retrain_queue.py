"""The retrain queue's contract, run against both backends: the JSON file (embedded stack) and
a real Redis (``CASCADE_TEST_REDIS_ADDRESS``; skipped when none answers)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from services.errors import DependencyUnavailable
from services.settings import Settings
from services.state.retrain_queue import (
    FileRetrainQueue,
    RedisRetrainQueue,
    RetrainQueue,
    leased,
    make_retrain_queue,
)
from tests.conftest import redis_url

DAY = 86_400


class Clock:
    """A settable clock (cool-downs and dedup expiry without waiting)."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["file", "redis"])
def make_queue(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., RetrainQueue]]:
    """A factory of queues sharing one backing store (like two replicas would)."""
    opened: list[RetrainQueue] = []
    if request.param == "file":

        def make(clock: Callable[[], float] = time.time) -> RetrainQueue:
            opened.append(FileRetrainQueue(tmp_path / "queue.json", clock))
            return opened[-1]

    else:
        url = redis_url(db=15)
        if url is None:
            pytest.skip("no Redis answers (set CASCADE_TEST_REDIS_ADDRESS or start one)")
        namespace = f"qtest-{uuid.uuid4().hex[:8]}"

        def make(clock: Callable[[], float] = time.time) -> RetrainQueue:
            opened.append(RedisRetrainQueue(url, namespace, clock=clock))
            return opened[-1]

    yield make
    if request.param == "redis":
        import redis

        client = redis.Redis.from_url(url)
        keys = list(client.scan_iter(f"{namespace}:*"))
        if keys:
            client.delete(*keys)
        client.close()
    for queue in opened:
        queue.close()


def test_a_new_key_is_enqueued_with_its_trigger(make_queue: Callable[..., RetrainQueue]) -> None:
    queue = make_queue()
    offer = queue.offer("group-a|0", {"alerts": [{"alertname": "CascadeFeatureDrift"}]}, 0, DAY)
    assert offer.decision == "enqueued" and offer.request_id
    [request] = queue.requests()
    assert request.id == offer.request_id
    assert request.dedup_key == "group-a|0"
    assert request.trigger == {"alerts": [{"alertname": "CascadeFeatureDrift"}]}


def test_the_same_key_again_is_a_duplicate(make_queue: Callable[..., RetrainQueue]) -> None:
    queue, other_replica = make_queue(), make_queue()
    first = queue.offer("group-a|0", {}, 0, DAY)
    again = other_replica.offer("group-a|0", {}, 0, DAY)
    assert again.decision == "duplicate" and again.request_id == first.request_id
    assert len(queue.requests()) == 1


def test_a_new_key_within_the_cooldown_is_refused_then_accepted_after_it(
    make_queue: Callable[..., RetrainQueue],
) -> None:
    clock = Clock()
    queue = make_queue(clock)
    assert queue.offer("group-a|0", {}, 3600, DAY).decision == "enqueued"
    clock.now += 3599
    assert queue.offer("group-b|0", {}, 3600, DAY).decision == "cooldown"
    clock.now += 1
    assert queue.offer("group-b|0", {}, 3600, DAY).decision == "enqueued"
    assert [r.dedup_key for r in queue.requests()] == ["group-a|0", "group-b|0"]


def test_a_refused_offer_is_not_remembered_as_seen(make_queue: Callable[..., RetrainQueue]) -> None:
    clock = Clock()
    queue = make_queue(clock)
    queue.offer("group-a|0", {}, 100, DAY)
    assert queue.offer("group-b|0", {}, 100, DAY).decision == "cooldown"
    clock.now += 100
    # refused during the cool-down, so not a duplicate afterwards
    assert queue.offer("group-b|0", {}, 100, DAY).decision == "enqueued"


def test_concurrent_offers_enqueue_exactly_one(make_queue: Callable[..., RetrainQueue]) -> None:
    queues = [make_queue() for _ in range(8)]
    decisions: list[str] = []

    def offer(queue: RetrainQueue, n: int) -> None:
        decisions.append(queue.offer(f"group-{n}|0", {}, 3600, DAY).decision)

    threads = [threading.Thread(target=offer, args=(q, n)) for n, q in enumerate(queues)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(decisions) == ["cooldown"] * 7 + ["enqueued"]
    assert len(queues[0].requests()) == 1


def test_claim_hands_out_the_oldest_request_once(make_queue: Callable[..., RetrainQueue]) -> None:
    queue = make_queue()
    queue.offer("a|0", {"n": 1}, 0, DAY)
    queue.offer("b|0", {"n": 2}, 0, DAY)
    first = queue.claim("worker-1", lease_s=600)
    second = queue.claim("worker-2", lease_s=600)
    assert first is not None and first.trigger == {"n": 1}
    assert second is not None and second.trigger == {"n": 2}
    assert queue.claim("worker-3", lease_s=600) is None
    queue.complete(first)
    assert [r.trigger for r in queue.requests()] == [{"n": 2}]


def test_an_empty_queue_claims_nothing(make_queue: Callable[..., RetrainQueue]) -> None:
    assert make_queue().claim("worker-1", lease_s=600) is None


def test_a_request_whose_worker_died_is_claimed_again_after_its_lease(
    make_queue: Callable[..., RetrainQueue],
) -> None:
    clock = Clock()
    queue = make_queue(clock)
    queue.offer("a|0", {"n": 1}, 0, DAY)
    claimed = queue.claim("worker-1", lease_s=0.2)
    assert claimed is not None
    assert queue.claim("worker-2", lease_s=0.2) is None  # leased
    clock.now += 0.3  # the file backend's clock
    time.sleep(0.3)  # Redis measures idle time itself
    again = queue.claim("worker-2", lease_s=0.2)
    assert again is not None and again.id == claimed.id and again.trigger == {"n": 1}


def test_a_renewed_lease_is_kept(make_queue: Callable[..., RetrainQueue]) -> None:
    clock = Clock()
    queue = make_queue(clock)
    queue.offer("a|0", {}, 0, DAY)
    claimed = queue.claim("worker-1", lease_s=0.4)
    assert claimed is not None
    for _ in range(3):
        clock.now += 0.3
        time.sleep(0.3)
        queue.renew(claimed, "worker-1")
        assert queue.claim("worker-2", lease_s=0.4) is None


def test_leased_renews_while_the_block_runs(make_queue: Callable[..., RetrainQueue]) -> None:
    queue = make_queue()
    queue.offer("a|0", {}, 0, DAY)
    claimed = queue.claim("worker-1", lease_s=1.0)
    assert claimed is not None
    with leased(queue, claimed, "worker-1", 1.0):  # renewed every 1/3 s
        time.sleep(2.0)
        assert queue.claim("worker-2", lease_s=1.0) is None


def test_dedup_is_forgotten_after_its_ttl(make_queue: Callable[..., RetrainQueue]) -> None:
    clock = Clock()
    queue = make_queue(clock)
    queue.offer("a|0", {}, 0, 1)
    clock.now += 2
    time.sleep(1.1)  # Redis expires the key itself (EX 1)
    assert queue.offer("a|0", {}, 0, 1).decision == "enqueued"


def test_an_unreachable_redis_is_a_dependency_error() -> None:
    from services.util.local_redis import free_port

    queue = RedisRetrainQueue(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.5)
    with pytest.raises(DependencyUnavailable, match="retrain queue"):
        queue.offer("a|0", {}, 0, DAY)
    with pytest.raises(DependencyUnavailable, match="retrain queue"):
        queue.claim("worker-1", 600)
    queue.close()


def test_the_settings_choose_the_backend(tmp_path: Path) -> None:
    embedded = make_retrain_queue(Settings(artifacts=tmp_path))
    assert isinstance(embedded, FileRetrainQueue)
    assert embedded.path == tmp_path / "retrain" / "queue.json"
    elsewhere = make_retrain_queue(
        Settings(artifacts=tmp_path, retrain_trigger={"queue_file": tmp_path / "q.json"})
    )
    assert isinstance(elsewhere, FileRetrainQueue) and elsewhere.path == tmp_path / "q.json"
    shared = make_retrain_queue(
        Settings(artifacts=tmp_path, redis={"url": "redis://127.0.0.1:1/0", "namespace": "ns"})
    )
    assert isinstance(shared, RedisRetrainQueue) and shared.stream == "ns:retrain:requests"


def test_a_corrupt_or_unwritable_queue_file_is_a_dependency_error_naming_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "queue.json"
    path.write_text("{not json")
    queue = FileRetrainQueue(path)
    with pytest.raises(DependencyUnavailable, match=r"queue\.json.*corrupt"):
        queue.offer("a|0", {}, 0, DAY)
    with pytest.raises(DependencyUnavailable, match="corrupt"):
        queue.claim("worker-1", 600)
    blocked = FileRetrainQueue(path / "below-a-file" / "queue.json")  # parent is a file
    with pytest.raises(DependencyUnavailable, match="below-a-file"):
        blocked.offer("a|0", {}, 0, DAY)
