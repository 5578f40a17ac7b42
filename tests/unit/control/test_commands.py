"""`cascade versions` and `cascade gc` on a fake export tree with the file registry."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from cli.main import main
from control.registry import FileRegistry, VersionState
from tests.unit.control.fake_exports import FAIL, FORCED, PASS, make_version, on_disk


@pytest.fixture
def artifacts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Versions 1-5: 1 previous production, 2 production, 3 rejected, 4 forced candidate,
    5 on disk only; no Redis anywhere (the file registry)."""
    for name in list(os.environ):
        if name.startswith("CASCADE_") and name != "CASCADE_FEEDBACK__REQUIRE_DURABLE":
            monkeypatch.delenv(name)
    root = tmp_path / "artifacts"
    registry = FileRegistry(root / "registry.json")
    for version, verdict in ((1, PASS), (2, PASS), (3, FAIL), (4, FORCED)):
        make_version(root, version, recall=0.1 + version / 100)
        registry.register(version, verdict)
    make_version(root, 5)
    registry.transition(1, VersionState.PRODUCTION, "deploy")
    registry.transition(2, VersionState.PRODUCTION, "promote")
    return root


def test_versions_prints_states_metrics_and_verdicts(
    artifacts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["versions", "--artifacts", str(artifacts)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "VERSION", "STATE", "CREATED", "RECALL@10", "NDCG@10", "AUC", "VERDICT", "FAILED", "CHECKS"
    ]  # fmt: skip
    rows = {line.split()[0]: line for line in lines[1:]}
    assert rows["1"].split()[1:3] == ["retired", "(previous)"]
    assert rows["2"].split()[1] == "production" and "0.1200" in rows["2"]
    assert "0.0600" in rows["2"] and "0.7267" in rows["2"]  # ndcg@10, auc
    assert rows["3"].split()[1] == "rejected"
    assert re.search(r" fail +recall@10 below production$", rows["3"])
    assert re.search(r" fail \(forced\) +auc below floor$", rows["4"])
    assert rows["4"].split()[1] == "candidate"
    assert rows["5"].split()[1] == "unregistered" and "2026-11-22 13:52" in rows["5"]


def test_versions_json_lists_every_version(
    artifacts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["versions", "--artifacts", str(artifacts), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["version"], r["state"]) for r in rows] == [
        (1, "retired"), (2, "production"), (3, "rejected"), (4, "candidate"), (5, "unregistered")
    ]  # fmt: skip
    assert rows[0]["previous_production"] and not rows[1]["previous_production"]
    assert rows[3]["verdict"] == FORCED and rows[1]["metrics"]["recall@10"] == pytest.approx(0.12)
    assert [h["to"] for h in rows[1]["history"]] == ["candidate", "production"]


def test_versions_with_nothing_exported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["versions", "--artifacts", str(tmp_path)]) == 0
    assert "no versions under" in capsys.readouterr().out


def test_gc_dry_run_prints_and_keeps_everything(
    artifacts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["gc", "--artifacts", str(artifacts), "--keep", "0", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "kept: serving 1, 2; newest 0 others -; not yet registered 5" in out
    assert "would remove version 3" in out and "would remove version 4" in out
    assert all(on_disk(artifacts, v) for v in range(1, 6))


def test_gc_removes_beyond_keep(artifacts: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gc", "--artifacts", str(artifacts), "--keep", "1"]) == 0
    out = capsys.readouterr().out
    assert "removed version 3: directories, registry record" in out
    assert "version 4" not in out.split("\n", 1)[1]  # kept: the newest other
    assert not on_disk(artifacts, 3) and on_disk(artifacts, 4)
    assert main(["gc", "--artifacts", str(artifacts), "--keep", "1"]) == 0
    assert "nothing to remove" in capsys.readouterr().out


def test_gc_keeps_the_pinned_version(
    artifacts: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CASCADE_MODEL_VERSION", "3")
    assert main(["gc", "--artifacts", str(artifacts), "--keep", "0"]) == 0
    assert "removed version 4" in capsys.readouterr().out
    assert on_disk(artifacts, 3)


def test_gc_errors_are_one_line(artifacts: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:  # a usage error: argparse says so
        main(["gc", "--artifacts", str(artifacts), "--keep", "-1"])
    assert stopped.value.code == 2
    assert "argument --keep: must be an integer >= 0, got '-1'" in capsys.readouterr().err
    with FileRegistry(artifacts / "registry.json").lock("gc", ttl_s=30):
        assert main(["gc", "--artifacts", str(artifacts)]) == 3
    assert "cascade: error: lock 'gc' is held by" in capsys.readouterr().err


def test_versions_marks_a_production_adopted_at_first_deploy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("CASCADE_") and name != "CASCADE_FEEDBACK__REQUIRE_DURABLE":
            monkeypatch.delenv(name)
    root = tmp_path / "artifacts"
    make_version(root, 1, recall=0.2)
    make_version(root, 2, recall=0.3)
    registry = FileRegistry(root / "registry.json")
    registry.adopt(1, "adopted: first deploy")
    registry.register(2, PASS)
    assert main(["versions", "--artifacts", str(root)]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert rows["1"].split()[1:3] == ["production", "(adopted)"]
    assert out.splitlines()[-1].startswith("metrics: each version's own test set")
    assert rows["2"].split()[1] == "candidate" and "(adopted)" not in rows["2"]
