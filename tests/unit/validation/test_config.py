from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.errors import ConfigError
from pipelines.validation.config import DEFAULT_FILE, GateConfig, load_gate_config


def test_packaged_file_equals_the_defaults() -> None:
    assert DEFAULT_FILE.is_file()
    assert load_gate_config() == GateConfig()


def test_a_partial_file_keeps_every_other_default(tmp_path: Path) -> None:
    path = tmp_path / "gate.yaml"
    path.write_text("floors:\n  recall@10: 0.3\nslices: {}\n")
    config = load_gate_config(path)
    assert config.floors.as_dict()["recall@10"] == 0.3
    assert config.floors.auc == GateConfig().floors.auc
    assert config.slices == {}


@pytest.mark.parametrize(
    "text", ["floors: {recall@11: 0.1}", "non_inferiority: {confidence: 2}", "a: [", "x: 1"]
)
def test_bad_files_name_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "gate.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"gate\.yaml"):
        load_gate_config(path)


def test_a_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_gate_config(tmp_path / "nope.yaml")
