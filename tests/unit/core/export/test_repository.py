from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.errors import ArtifactError
from core.export.repository import VersionWriter, latest_version, next_version, sha256


def _export(root: Path, payload: str) -> int:
    writer = VersionWriter(root)
    version = writer.claim()
    staged = writer.staging("ranker")
    (staged / "model.txt").write_text(payload)
    writer.publish("ranker", staged)
    assert writer.release is not None
    (writer.release / "index.bin").write_text(payload)
    writer.finish({"note": payload})
    return version


def test_versions_increase_and_old_ones_are_untouched(tmp_path: Path) -> None:
    assert latest_version(tmp_path) is None and next_version(tmp_path) == 1
    assert _export(tmp_path, "first") == 1
    assert _export(tmp_path, "second") == 2
    assert (tmp_path / "model_repository/ranker/1/model.txt").read_text() == "first"
    assert (tmp_path / "model_repository/ranker/2/model.txt").read_text() == "second"
    assert latest_version(tmp_path) == 2


def test_manifest_lists_checksums_of_every_file(tmp_path: Path) -> None:
    _export(tmp_path, "x")
    manifest = json.loads((tmp_path / "releases/1/manifest.json").read_text())
    assert manifest["version"] == 1 and manifest["note"] == "x"
    assert set(manifest["files"]) == {"model_repository/ranker/1/model.txt", "releases/1/index.bin"}
    for name, digest in manifest["files"].items():
        assert sha256(tmp_path / name) == digest


def test_publish_never_replaces_an_existing_version(tmp_path: Path) -> None:
    (tmp_path / "model_repository/ranker/1").mkdir(parents=True)
    (tmp_path / "model_repository/ranker/1/model.txt").write_text("keep me")
    writer = VersionWriter(tmp_path)
    writer.version = 1  # pretend a stale number was claimed
    staged = writer.staging("ranker")
    with pytest.raises(ArtifactError, match="never overwrite"):
        writer.publish("ranker", staged)
    assert (tmp_path / "model_repository/ranker/1/model.txt").read_text() == "keep me"


def test_claim_skips_versions_present_anywhere(tmp_path: Path) -> None:
    (tmp_path / "model_repository/query_tower/7").mkdir(parents=True)
    assert VersionWriter(tmp_path).claim() == 8


def test_abandon_removes_only_the_failed_version(tmp_path: Path) -> None:
    _export(tmp_path, "good")
    writer = VersionWriter(tmp_path)
    writer.claim()
    writer.publish("ranker", writer.staging("ranker"))
    writer.staging("query_tower")
    writer.abandon()
    assert latest_version(tmp_path) == 1
    assert not (tmp_path / "model_repository/ranker/2").exists()
    assert not list((tmp_path / "model_repository").glob("*/.staging-*"))
    assert (tmp_path / "model_repository/ranker/1/model.txt").read_text() == "good"


def test_incomplete_version_is_not_latest(tmp_path: Path) -> None:
    _export(tmp_path, "done")
    VersionWriter(tmp_path).claim()  # claimed, never finished
    assert latest_version(tmp_path) == 1
