"""What production learnt from, read from its manifest (control.retrain.job)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from control.retrain.job import production_learnt
from pipelines.config import TrainConfig
from pipelines.data.synthetic import make_synthetic
from pipelines.pipeline import split_for
from pipelines.split import PERMUTATION, SPLIT_METHOD

DATA = make_synthetic(50, 40, 1000, seed=0)
ALL_ROWS = np.arange(1000)


def _manifest(root: Path, version: int, manifest: dict) -> None:
    directory = root / "releases" / str(version)
    directory.mkdir(parents=True)
    (directory / "manifest.json").write_text(json.dumps(manifest))


def test_no_production_learnt_nothing(tmp_path: Path) -> None:
    learnt = production_learnt(tmp_path, None, DATA, ALL_ROWS)
    assert learnt.base_rows is None and learnt.until is None


def test_a_retrained_version_learnt_up_to_its_recorded_time(tmp_path: Path) -> None:
    _manifest(tmp_path, 3, {"training_data": {"learnt_until": 12345}})
    learnt = production_learnt(tmp_path, 3, DATA, ALL_ROWS)
    assert learnt.until == 12345 and learnt.base_rows is None


def test_a_trained_version_of_the_same_data_learnt_its_train_and_valid_rows(
    tmp_path: Path,
) -> None:
    config = {"seed": 4, "split_protocol": "per_user"}
    manifest = {"data_hash": DATA.content_hash(), "config": config}
    _manifest(tmp_path, 1, {**manifest, "split_method": SPLIT_METHOD})
    base_rows = ALL_ROWS[::2]  # a --base-fraction cut: only these rows are in use
    learnt = production_learnt(tmp_path, 1, DATA, base_rows)
    split = split_for(DATA, TrainConfig(seed=4, split_protocol="per_user"))
    expected = np.ones(1000, bool)
    expected[split.test] = False
    assert learnt.base_rows is not None
    assert np.array_equal(learnt.base_rows, expected[base_rows])
    assert "per_user random split, seed 4" in learnt.source


def test_a_version_exported_before_the_hashed_split_is_reconstructed_by_permutation(
    tmp_path: Path,
) -> None:
    """No ``split_method`` in its manifest: the seeded permutation it was trained with."""
    for protocol in ("global", "per_user"):
        root = tmp_path / protocol
        config = {"seed": 4, "split_protocol": protocol}
        _manifest(root, 1, {"data_hash": DATA.content_hash(), "config": config})
        learnt = production_learnt(root, 1, DATA, ALL_ROWS)
        old = split_for(DATA, TrainConfig(seed=4, split_protocol=protocol), PERMUTATION)
        expected = np.ones(1000, bool)
        expected[old.test] = False
        assert learnt.base_rows is not None and np.array_equal(learnt.base_rows, expected)
        new = split_for(DATA, TrainConfig(seed=4, split_protocol=protocol))
        assert not np.array_equal(old.test, new.test)  # the hashed split would be wrong
        assert PERMUTATION in learnt.source


def test_an_unknown_split_method_is_not_guessed(tmp_path: Path) -> None:
    config = {"seed": 4, "split_protocol": "global"}
    manifest = {"data_hash": DATA.content_hash(), "config": config, "split_method": "later"}
    _manifest(tmp_path, 1, manifest)
    learnt = production_learnt(tmp_path, 1, DATA, ALL_ROWS)
    assert learnt.base_rows is None and "split is unknown" in learnt.source


def test_another_data_set_or_no_record_means_all_base_data(tmp_path: Path) -> None:
    _manifest(tmp_path, 1, {"data_hash": "not-this-data", "config": {"seed": 0}})
    newest = int(DATA.interactions["timestamp"].max())
    for version in (1, 2):  # 2: no manifest at all
        learnt = production_learnt(tmp_path, version, DATA, ALL_ROWS)
        assert learnt.until == newest and learnt.base_rows is None
        assert "split is unknown" in learnt.source


def test_a_version_trained_on_the_oldest_part_learnt_nothing_newer(tmp_path: Path) -> None:
    from pipelines.data.schema import oldest, oldest_rows

    trained = oldest(DATA, 0.7)
    config = {"seed": 0, "split_protocol": "global"}
    manifest = {"data_hash": trained.content_hash(), "config": config, "base_fraction": 0.7}
    _manifest(tmp_path, 1, {**manifest, "split_method": SPLIT_METHOD})
    learnt = production_learnt(tmp_path, 1, DATA, ALL_ROWS)
    assert learnt.base_rows is not None and "oldest 0.7 of the data" in learnt.source
    positions = oldest_rows(DATA, 0.7)
    newer = np.setdiff1d(ALL_ROWS, positions)
    assert not learnt.base_rows[newer].any()  # the newest 30 %: new to production
    split = split_for(trained, TrainConfig(seed=0))
    assert learnt.base_rows[positions[split.train]].all()
    assert not learnt.base_rows[positions[split.test]].any()


def test_logs_that_grew_since_training_are_new_after_the_watermark(tmp_path: Path) -> None:
    """A dataset file whose logs gained files since production was trained: its data hash
    no longer matches, so the rows newer than the newest it trained on are new to it."""
    stamps = np.sort(DATA.interactions["timestamp"].to_numpy())
    watermark = int(stamps[len(stamps) // 2])
    _manifest(tmp_path, 1, {"data_hash": "before-the-new-files", "newest_timestamp": watermark})
    learnt = production_learnt(tmp_path, 1, DATA, ALL_ROWS)
    assert learnt.until == watermark and learnt.base_rows is None
    mask = learnt.mask(len(DATA.interactions), DATA.interactions["timestamp"].to_numpy())
    assert 0 < mask.sum() < len(mask)
    assert "newer rows are new to it" in learnt.source


def test_the_retrain_reads_the_data_production_was_trained_on(tmp_path: Path) -> None:
    from control.retrain.job import production_source

    _manifest(tmp_path, 1, {"source": "/data/shop/dataset.yaml"})
    _manifest(tmp_path, 2, {"data_hash": "x"})  # before sources were recorded
    assert production_source(tmp_path, 1) == "/data/shop/dataset.yaml"
    assert production_source(tmp_path, 2) == "movielens"
    assert production_source(tmp_path, None) == "movielens"
