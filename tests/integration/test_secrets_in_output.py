"""Redis passwords never reach cascade's output or errors (issue 8, item 10)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.main import main
from services.util.local_redis import free_port, start_redis_server

pytestmark = pytest.mark.integration

PASSWORD = "pw-that-must-not-leak"


def test_materialize_never_prints_the_password(
    exported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        url, process = start_redis_server(tmp_path, password=PASSWORD)
    except FileNotFoundError:
        pytest.skip("redis-server is not installed (.ci/run installs it)")
    try:
        code = main(["materialize", "--artifacts", str(exported), "--redis-url", url])
        out, err = capsys.readouterr()
        assert code == 0 and "materialized" in out
        assert "redis://:***@127.0.0.1" in out
        assert PASSWORD not in out + err
    finally:
        process.kill()
        process.wait()


def test_a_failing_materialize_names_the_redis_without_its_password(
    exported: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"  # nothing listens there
    code = main(["materialize", "--artifacts", str(exported), "--redis-url", url])
    out, err = capsys.readouterr()
    assert code == 3
    assert err.startswith("cascade: error: materialize into redis://:***@127.0.0.1")
    assert "Traceback" not in err and PASSWORD not in out + err


def test_settings_errors_never_echo_the_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CASCADE_REDIS__URL", f"redis://:{PASSWORD}@redis:6379/0")
    monkeypatch.setenv("CASCADE_REDIS__TIMEOUT_MS", "fast")
    code = main(["materialize"])
    _, err = capsys.readouterr()
    assert code == 3 and "timeout_ms" in err and PASSWORD not in err
