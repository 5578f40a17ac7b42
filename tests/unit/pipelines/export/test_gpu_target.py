"""The GPU target's export side: the check that FIL (through Treelite, its reader) answers
what LightGBM answers, with categorical splits and missing values; the parts a target names;
the logit of a float32 probability."""

from __future__ import annotations

from pathlib import Path

import lightgbm as lgb
import numpy as np
import pytest

from core.errors import ArtifactError
from core.logit import PROBABILITY_FLOOR, probability_logits
from pipelines.export import gpu_target


@pytest.fixture
def trees(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """A LightGBM binary model over 4 numeric and 2 categorical columns, and rows with a
    missing value and an unseen category."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3000, 6)).astype(np.float32)
    x[:, 4] = rng.integers(0, 12, 3000)
    x[:, 5] = rng.integers(0, 4, 3000)
    y = (x[:, 0] + (x[:, 4] % 3 == 0) + rng.normal(scale=0.5, size=3000) > 0.5).astype(int)
    booster = lgb.train(
        {"objective": "binary", "verbose": -1, "num_leaves": 15},
        lgb.Dataset(x, y, categorical_feature=[4, 5]),
        40,
    )
    path = tmp_path / "gbm.txt"
    booster.save_model(str(path))
    rows = x[:500].copy()
    rows[0, 1] = np.nan
    rows[1, 4] = 99  # a category the trees never saw
    return path, rows


def test_fil_reads_the_trees_as_lightgbm_does(trees: tuple[Path, np.ndarray]) -> None:
    parity = gpu_target.fil_parity(*trees)
    assert parity["probability"] <= 1e-6
    assert parity["logit"] <= gpu_target.LOGIT_TOLERANCE
    assert parity["saturated"] == 0.0


def test_a_difference_beyond_the_tolerance_refuses_the_export(
    trees: tuple[Path, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    import treelite

    real = treelite.gtil.predict
    monkeypatch.setattr(treelite.gtil, "predict", lambda model, rows: real(model, rows) + 1e-3)
    with pytest.raises(ArtifactError, match=r"gbm\.txt: FIL .* differs from LightGBM"):
        gpu_target.fil_parity(*trees)


def test_a_model_treelite_cannot_read_is_named(tmp_path: Path) -> None:
    path = tmp_path / "gbm.txt"
    path.write_text("not a model\n")
    with pytest.raises(ArtifactError, match=r"gbm\.txt: Treelite \(FIL's reader\) refuses it"):
        gpu_target.fil_parity(path, np.zeros((2, 3), np.float32))


def test_no_rows_is_an_error(trees: tuple[Path, np.ndarray]) -> None:
    with pytest.raises(ArtifactError, match="needs rows"):
        gpu_target.fil_parity(trees[0], np.zeros((0, 6), np.float32))


def test_targets_name_their_parts() -> None:
    assert gpu_target.triton_parts("cpu") == {}
    assert (
        gpu_target.triton_parts("gpu")
        == gpu_target.triton_parts("gpu-tensorrt")
        == {
            "trees": "ranker_trees",
            "dense": "ranker_dense",
        }
    )
    with pytest.raises(ArtifactError, match="unknown Triton target 'tpu'"):
        gpu_target.triton_parts("tpu")


def test_probability_logits_invert_the_sigmoid_and_stay_finite() -> None:
    margins = np.array([-8.0, -1.0, 0.0, 2.5, 9.0])
    p = (1 / (1 + np.exp(-margins))).astype(np.float32)
    np.testing.assert_allclose(probability_logits(p), margins, atol=1e-3)
    ends = probability_logits(np.array([0.0, 1.0], np.float32))
    assert np.all(np.isfinite(ends))
    bound = np.log(1 / PROBABILITY_FLOOR - 1)
    np.testing.assert_allclose(ends, [-bound, bound], rtol=1e-3)
