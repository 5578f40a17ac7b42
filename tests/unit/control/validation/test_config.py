from __future__ import annotations

from pathlib import Path

import pytest

from control.validation.config import DEFAULT_FILE, GateConfig, load_gate_config
from core.errors import ConfigError


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


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "floors: {recall@10: -5}",
            "floors.recall@10: -5 is below 0, so the check could never fail",
        ),
        ("floors: {ndcg@10: 1.5}", "floors.ndcg@10: 1.5 is above 1, so the check could never pass"),
        ("floors: {logloss: 0}", "floors.logloss: 0 is not above 0, so the check could never pass"),
        ("floors: {auc: .nan}", "floors.auc: input should be a finite number (got nan)"),
        ("floors: {logloss: .inf}", "floors.logloss: input should be a finite number (got inf)"),
        (
            "non_inferiority: {margins: {recall@10: 7}}",
            "non_inferiority.margins.recall@10: 7 is not below 1: it allows losing 700% of "
            "production's recall@10, so the check could never fail",
        ),
        (
            "non_inferiority: {margins: {auc: -0.1}}",
            "non_inferiority.margins.auc: -0.1 is below 0: the candidate would have to beat "
            "production by 10%, so an equal candidate could never pass",
        ),
        (
            "non_inferiority: {margins: {logloss: 1}}",
            "non_inferiority.margins.logloss: 1 is not below 1: a candidate with 2 times "
            "production's LogLoss would pass",
        ),
        (
            "slices: {new_users: {floors: {auc: -1}}}",
            "slices.new_users.floors.auc: -1 is below 0, so the check could never fail",
        ),
        ("floors: {recall@11: 0.1}", "floors.recall@11: unknown key"),
    ],
)
def test_a_threshold_that_makes_its_check_vacuous_is_refused_by_key(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "gate.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load_gate_config(path)
    assert str(refused.value) == f"gate config {path}: {message}"


def test_the_edges_of_each_range_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "gate.yaml"
    path.write_text(
        "floors: {recall@10: 0, ndcg@10: 1, auc: 0.5, logloss: 5}\n"
        "non_inferiority: {margins: {recall@10: 0, ndcg@10: 0.99}}\n"
    )
    assert load_gate_config(path).floors.as_dict()["recall@10"] == 0.0
    small = load_gate_config(DEFAULT_FILE.with_name("gate-small-holdout.yaml"))
    assert small.non_inferiority.margins["recall@10"] == 0.45


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"cannot read gate config {tmp_path}: Is a directory"):
        load_gate_config(tmp_path)
