"""`cascade materialize --candidate`: what the alert-triggered retrain worker runs on a
schedule; it loads the newest candidate into Redis, and does nothing when there is none."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import redis

from cli.main import main
from control.registry import RedisRegistry
from tests.conftest import redis_url

pytestmark = pytest.mark.integration


@pytest.fixture
def url() -> str:
    found = redis_url(db=12)
    if found is None:
        pytest.skip("no Redis answers (set CASCADE_TEST_REDIS_ADDRESS or start one)")
    redis.Redis.from_url(found).flushdb()
    return found


def test_materialize_candidate_loads_the_newest_candidate_or_nothing(
    exported: Path, url: str, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.setenv("CASCADE_REDIS__URL", url)
    root = ["--artifacts", str(exported), "--redis-url", url]
    assert main(["materialize", "--candidate", *root]) == 0
    assert "no candidate (nothing to do)" in capsys.readouterr().out
    assert redis.Redis.from_url(url).dbsize() == 0

    RedisRegistry(url, "cascade").register(1, {"verdict": "pass", "failed_checks": []})
    assert main(["materialize", "--candidate", *root]) == 0
    assert "of release 1 into" in capsys.readouterr().out
    assert redis.Redis.from_url(url).dbsize() > 10


def test_candidate_and_version_exclude_each_other(
    exported: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["materialize", "--candidate", "--version", "1", "--redis-url", url]
    assert main([*argv, "--artifacts", str(exported)]) == 2
    assert "--candidate and --version exclude each other" in capsys.readouterr().err


def test_serve_materialize_loads_the_latest_release_before_the_gateway_starts(
    exported: Path, url: str, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    """`cascade serve --materialize` fills Redis with the newest release, then serves."""
    import services.api.server

    started: list[tuple[str, int]] = []

    def serve(host: str, port: int, workers: int, settings: object) -> None:
        started.append((host, port))
        assert redis.Redis.from_url(url).dbsize() > 10  # materialized first

    monkeypatch.setattr(services.api.server, "serve", serve)
    monkeypatch.setenv("CASCADE_REDIS__URL", url)
    monkeypatch.setenv("CASCADE_ARTIFACTS", str(exported))  # serve sets it: restored after
    previous = signal.getsignal(signal.SIGTERM)  # serve installs its own handler
    try:
        argv = ["serve", "--artifacts", str(exported), "--materialize", "--port", "18231"]
        assert main(argv) == 0
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert "of release 1 into" in capsys.readouterr().out
    assert started == [("127.0.0.1", 18231)]
