"""The durable Redis behind Sentinels (issue 35): a primary with AOF, a replica and three
Sentinels on loopback, all real. The primary is killed while a gateway serves; the Sentinels
promote the replica, and the gateway's feedback and the registry carry on against it with
what was written before the failover."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis
from pydantic import SecretStr

from cli.main import main
from control.registry import RegistryUnavailable, make_registry
from services.settings import FeedbackSettings, RedisSettings, Settings
from services.util.local_redis import start_redis_server
from services.util.local_redis_sentinel import SERVICE, start_redis_sentinel
from tests.conftest import TEST_FEEDBACK_KEY, app_client

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _primary_port(sentinel_port: int) -> int:
    answer = redis.Redis(port=sentinel_port).sentinel_get_master_addr_by_name(SERVICE)
    return int(answer[1])


async def _until_stored(http, event: dict, timeout_s: float) -> float:  # type: ignore[no-untyped-def]
    """Post ``event`` until it is stored (a failover in progress answers 503); the seconds."""
    started = time.monotonic()
    while True:
        answer = await http.post("/v1/feedback", json={"events": [event]})
        if answer.status_code == 200:
            return time.monotonic() - started
        assert answer.status_code == 503, answer.text  # never a 500
        assert time.monotonic() - started < timeout_s, "no primary after the failover"
        await asyncio.sleep(0.2)


async def test_the_durable_role_follows_a_failover(
    exported: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    try:
        setup = start_redis_sentinel(tmp_path / "sentinel")
    except FileNotFoundError as missing:
        pytest.skip(str(missing))
    features_url, features = start_redis_server(tmp_path)
    try:
        monkeypatch.setenv("CASCADE_REDIS__URL", features_url)
        monkeypatch.setenv("CASCADE_REDIS__DURABLE_URL", setup.url)
        materialize = ["materialize", "--artifacts", str(exported), "--redis-url", features_url]
        assert await asyncio.to_thread(main, materialize) == 0
        settings = Settings(
            artifacts=exported,
            redis=RedisSettings(url=features_url, durable_url=setup.url),
            feedback=FeedbackSettings(keys=[SecretStr(TEST_FEEDBACK_KEY)]),
        )
        registry = make_registry(settings)
        async with app_client(settings) as http:
            assert (await http.get("/health/ready")).json()["feedback_durable"] is True
            answer = await http.post("/v1/recommend", json={"user_id": 1, "k": 5})
            item = answer.json()["items"][0]["item_id"]
            event = {"user_id": 1, "item_id": item, "type": "click", "event_id": "before"}
            assert await _until_stored(http, event, 1.0) < 1.0
            registry.register(1, {"verdict": "pass", "failed_checks": []})
            primary = redis.Redis(port=setup.primary_port)
            assert primary.execute_command("WAIT", 1, 2000) == 1  # on the replica too
            primary.close()

            setup.kill(setup.primary_port)
            meanwhile = await http.post("/v1/recommend", json={"user_id": 1, "k": 5})
            assert meanwhile.status_code == 200  # answers need no durable write
            deadline = time.monotonic() + 30
            while _primary_port(setup.sentinel_ports[0]) != setup.replica_port:
                assert time.monotonic() < deadline, "the Sentinels promoted no replica"
                await asyncio.sleep(0.2)

            event = {**event, "event_id": "after"}
            await _until_stored(http, event, 15.0)
            assert (await http.post("/v1/recommend", json={"user_id": 1, "k": 5})).is_success
        assert registry.get(1) is not None  # written before the failover, read after
        registry.register(2, {"verdict": "pass", "failed_checks": []})
        registry.close()
        promoted = redis.Redis(port=setup.replica_port)
        streams = list(promoted.scan_iter(match="cascade:*:feedback"))
        assert len(streams) == 1 and promoted.xlen(streams[0]) == 2
        assert promoted.info("replication")["role"] == "master"
        promoted.close()
    finally:
        setup.stop()
        features.kill()
        features.wait()


def test_with_no_sentinel_answering_the_call_fails_naming_the_service() -> None:
    from services.util.local_redis import free_port

    url = f"redis+sentinel://127.0.0.1:{free_port()}/{SERVICE}/0"
    registry = make_registry(
        Settings(redis=RedisSettings(url="redis://127.0.0.1:1/0", durable_url=url))
    )
    with pytest.raises(RegistryUnavailable, match=f"No master found for '{SERVICE}'"):
        registry.get(1)
    registry.close()
