"""Property-based API testing with schemathesis against a real gateway (uvicorn with the
guarded protocol on a loopback port, the embedded default behind it): every operation of
the OpenAPI document, valid and invalid inputs (examples, coverage and fuzzing phases), all
of schemathesis's checks — no server error, statuses, content types, headers and bodies as
documented, invalid data rejected, valid data accepted. Bounded examples keep it short."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.settings import Settings
from tests.integration.served_app import served_app

pytestmark = pytest.mark.integration

EXAMPLES = 30  # per operation in the fuzzing phase
# sent to every operation: the admin token and a feedback key (those operations need one)
ADMIN_TOKEN = "schemathesis-admin-token"


@pytest.fixture(scope="module")
def gateway_url(exported: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    settings = Settings(
        artifacts=exported,
        admin={"token": ADMIN_TOKEN},  # the webhook is exercised too, its queue kept aside
        feedback={"keys": [ADMIN_TOKEN], "require_durable": False},
        retrain_trigger={"queue_file": tmp_path_factory.mktemp("queue") / "queue.json"},
    )
    with served_app(settings) as url:
        yield url


def test_every_operation_conforms_to_its_schema(gateway_url: str, tmp_path: Path) -> None:
    st = Path(sys.executable).parent / "st"
    if not st.is_file():
        pytest.skip("schemathesis is not installed (the dev extra installs it)")
    report = subprocess.run(
        [
            str(st),
            "--config-file",
            str(Path(__file__).with_name("schemathesis.toml")),
            "run",
            f"{gateway_url}/openapi.json",
            "--checks",
            "all",
            "--mode",
            "all",
            "--max-examples",
            str(EXAMPLES),
            "--seed",
            "20261122",
            "--generation-database",
            "none",
            "--request-timeout",
            "30",
            "--header",
            f"Authorization: Bearer {ADMIN_TOKEN}",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "NO_COLOR": "1"},
    )
    output = report.stdout + report.stderr
    assert report.returncode == 0, output[-6000:]
    assert "No issues found" in output, output[-3000:]
