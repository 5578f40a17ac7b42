"""Checking a version's files against the sha256 table of its manifest."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from core.errors import ArtifactError
from core.export.repository import VersionWriter
from core.export.verify import (
    ArtifactVerificationError,
    file_sha256,
    verify_model_directory,
    verify_version,
)


def _export(root: Path) -> int:
    writer = VersionWriter(root)
    version = writer.claim()
    staged = writer.staging("ranker")
    (staged / "weights.bin").write_bytes(bytes(range(256)) * 64)
    (staged / "spec.json").write_text('{"rows": 3}')
    writer.publish("ranker", staged)
    assert writer.release is not None
    (writer.release / "index.bin").write_bytes(b"\x01" * 1000)
    writer.finish({})
    return version


def _rewrite_same_size(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_an_intact_version_verifies_every_listed_file(tmp_path: Path) -> None:
    version = _export(tmp_path)
    result = verify_version(tmp_path, version)
    assert (result.files, result.bytes, result.unverified) == (3, 16384 + 11 + 1000, False)
    model = verify_model_directory(tmp_path / "model_repository/ranker/1")
    assert (model.files, model.unlisted) == (2, [])


def test_a_changed_file_is_hashed_again_not_remembered(tmp_path: Path) -> None:
    _export(tmp_path)
    weights = tmp_path / "model_repository/ranker/1/weights.bin"
    verify_model_directory(weights.parent)  # hashed and remembered
    _rewrite_same_size(weights)
    with pytest.raises(ArtifactVerificationError) as error:
        verify_model_directory(weights.parent)
    assert error.value.name == "model_repository/ranker/1/weights.bin"
    assert error.value.actual == file_sha256(weights) != error.value.expected
    assert "re-copy the version" in str(error.value)


def test_the_caller_says_what_to_do(tmp_path: Path) -> None:
    _export(tmp_path)
    (tmp_path / "releases/1/index.bin").unlink()
    with pytest.raises(ArtifactVerificationError, match=r"missing.*; nothing was written") as error:
        verify_version(tmp_path, 1, ["releases/1"], hint="nothing was written")
    assert error.value.actual is None and "releases/1/index.bin" in str(error.value)


def test_every_bad_file_is_counted_in_one_error(tmp_path: Path) -> None:
    _export(tmp_path)
    _rewrite_same_size(tmp_path / "model_repository/ranker/1/weights.bin")
    (tmp_path / "releases/1/index.bin").write_bytes(b"\x02" * 1000)
    with pytest.raises(ArtifactVerificationError, match=r"1 more bad file\(s\): releases/1"):
        verify_version(tmp_path, 1)


def test_unlisted_files_are_reported_not_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _export(tmp_path)
    directory = tmp_path / "model_repository/ranker/1"
    (directory / "notes.txt").write_text("an operator's note")
    (directory / "__pycache__").mkdir()
    (directory / "__pycache__/model.cpython-311.pyc").write_bytes(b"bytecode")
    with caplog.at_level(logging.WARNING):
        result = verify_model_directory(directory)
    assert result.unlisted == ["model_repository/ranker/1/notes.txt"]
    assert "notes.txt" in caplog.text and "pyc" not in caplog.text


def test_a_manifest_without_a_sha256_table_loads_unverified_and_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _export(tmp_path)
    manifest = tmp_path / "releases/1/manifest.json"
    manifest.write_text(json.dumps({"version": 1}))
    _rewrite_same_size(tmp_path / "releases/1/index.bin")
    with caplog.at_level(logging.WARNING):
        assert verify_version(tmp_path, 1).unverified
    assert "UNVERIFIED" in caplog.text


def test_a_model_directory_away_from_its_release_loads_unverified(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _export(tmp_path / "export")
    copy = tmp_path / "elsewhere/model_repository/ranker/1"
    shutil.copytree(tmp_path / "export/model_repository/ranker/1", copy)
    with caplog.at_level(logging.WARNING):
        assert verify_model_directory(copy).unverified
    assert "no release manifest" in caplog.text


def test_a_missing_or_unreadable_manifest_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match=r"manifest\.json is missing"):
        verify_version(tmp_path, 1)
    _export(tmp_path)
    (tmp_path / "releases/1/manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        verify_version(tmp_path, 1)


def test_a_model_directory_is_named_by_its_version(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="named by its version"):
        verify_model_directory(tmp_path / "model_repository/ranker/latest")
