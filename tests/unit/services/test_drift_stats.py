"""Drift statistics: PSI and JS distance against independent formulas, the binning contract,
the sliding window, the reference file (issue 11)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.spatial.distance import jensenshannon

from core.errors import ArtifactError
from core.export.drift_reference import (
    ITEM_QUANTITIES,
    USER_QUANTITIES,
    Reference,
    read_reference,
    weighted_quantiles,
    write_reference,
)
from services.drift.counting import popularity_percentiles
from services.drift.window import PSI_EPSILON, VersionWindow, js_distance, psi


def _independent_psi(counts: np.ndarray, reference: np.ndarray) -> float:
    total = 0.0
    for c, r in zip(counts / counts.sum(), reference, strict=True):
        a = c if c > 0 else PSI_EPSILON
        e = r if r > 0 else PSI_EPSILON
        total += (a - e) * np.log(a / e)
    return float(total)


@pytest.mark.parametrize("seed", range(5))
def test_psi_and_js_match_independent_implementations(seed: int) -> None:
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 50, 10).astype(float)
    counts[rng.integers(0, 10)] = 0  # an empty window bin
    reference = rng.random(10)
    reference[rng.integers(0, 10)] = 0  # an empty reference bin
    reference /= reference.sum()
    assert psi(counts, reference) == pytest.approx(_independent_psi(counts, reference), abs=1e-6)
    assert js_distance(counts, reference) == pytest.approx(
        float(jensenshannon(counts, reference, base=2)), abs=1e-6
    )


def test_identical_distributions_have_no_drift_and_disjoint_ones_the_most() -> None:
    reference = np.asarray([0.25, 0.25, 0.5])
    assert psi(np.asarray([25.0, 25, 50]), reference) == pytest.approx(0.0, abs=1e-12)
    assert js_distance(np.asarray([25.0, 25, 50]), reference) == pytest.approx(0.0, abs=1e-7)
    assert js_distance(np.asarray([0.0, 0, 0, 7]), np.asarray([0.5, 0.5, 0, 0])) == 1.0


def test_weighted_quantiles_match_numpy_inverted_cdf() -> None:
    rng = np.random.default_rng(0)
    values, weights = rng.normal(size=500), rng.random(500)
    q = np.arange(1, 10) / 10
    expected = np.quantile(values, q, weights=weights, method="inverted_cdf")
    np.testing.assert_allclose(weighted_quantiles(values, weights, q), expected)


def test_reference_bins_discrete_values_once_and_keeps_outer_bins_open() -> None:
    reference = Reference.fit(np.asarray([1.0] * 30 + [2.0] * 70), None, bins=10)
    np.testing.assert_array_equal(reference.edges, [1.0, 2.0])
    np.testing.assert_allclose(reference.proportions, [0.0, 0.3, 0.7])  # bin 0: below 1
    continuous = Reference.fit(np.random.default_rng(1).normal(size=1000), None, bins=10)
    assert len(continuous.edges) == 9
    np.testing.assert_allclose(continuous.proportions, 0.1, atol=0.002)
    with pytest.raises(ArtifactError, match="no finite reference values"):
        Reference.fit(np.asarray([np.nan]), None, bins=10)


def _window(slots: int = 3, slot_s: float = 10.0, catalog: int = 8) -> VersionWindow:
    references = {
        name: Reference(np.asarray([0.0, 1.0, 2.0]), np.asarray([0.1, 0.2, 0.3, 0.4]), 100)
        for name in (*USER_QUANTITIES, *ITEM_QUANTITIES)
    }
    references["user_gender"] = Reference(np.asarray([1.0]), np.asarray([0.5, 0.5]), 100)
    return VersionWindow(references, np.linspace(0, 1, catalog), 20, slots, slot_s)


def test_window_bins_like_searchsorted_right() -> None:
    window = _window()
    rng = np.random.default_rng(2)
    items = rng.choice([-1.0, 0.0, 0.5, 1.0, 2.0, 3.0], (50, len(ITEM_QUANTITIES)))
    user = np.full(len(USER_QUANTITIES), 1.0)
    window.add(user, items, now=5.0)
    counts = window.window_counts(5.0)
    for j in range(len(ITEM_QUANTITIES)):
        expected = np.bincount(np.searchsorted([0.0, 1.0, 2.0], items[:, j], "right"), None, 4)
        np.testing.assert_array_equal(counts[len(USER_QUANTITIES) + j], expected)
    np.testing.assert_array_equal(counts[0], [0, 1, 0, 0])  # gender: 1 -> bin [1, inf)
    np.testing.assert_array_equal(counts[1], [0, 0, 1, 0])


def test_window_slides_and_stats_follow_the_counts() -> None:
    window = _window(slots=3, slot_s=10.0)
    user = np.zeros(len(USER_QUANTITIES))
    window.add(user, np.full((4, len(ITEM_QUANTITIES)), 2.5), now=1.0)
    window.add(user, np.full((2, len(ITEM_QUANTITIES)), -1.0), now=21.0)
    stats = window.stats(21.0)["item_year"]
    assert stats.samples == 6
    counts = np.asarray([2.0, 0, 0, 4])
    reference = np.asarray([0.1, 0.2, 0.3, 0.4])
    assert stats.psi == pytest.approx(_independent_psi(counts, reference), abs=1e-6)
    assert stats.js_distance == pytest.approx(jensenshannon(counts, reference, base=2), abs=1e-6)
    assert window.stats(31.0)["item_year"].samples == 2  # the slot of t=1 left the window
    assert window.stats(41.0)["user_age"].samples == 1
    empty = window.stats(51.0)["item_year"]
    assert empty.samples == 0 and np.isnan(empty.psi) and np.isnan(empty.js_distance)


def test_coverage_and_popularity_over_the_window() -> None:
    window = _window(slots=2, slot_s=10.0, catalog=8)
    assert window.coverage(0.0) == 0.0 and window.popularity_mean(0.0) is None
    window.add_served(np.asarray([0, 1, 7]), now=1.0)
    window.add_served(np.asarray([7, 3]), now=11.0)
    assert window.coverage(11.0) == pytest.approx(4 / 8)
    percentiles = np.linspace(0, 1, 8)
    assert window.popularity_mean(11.0) == pytest.approx(
        float(np.mean(percentiles[[0, 1, 7, 7, 3]]))
    )
    assert window.coverage(21.0) == pytest.approx(2 / 8)  # only t=11 remains
    assert window.popularity_mean(21.0) == pytest.approx(float(percentiles[[7, 3]].mean()))


def test_popularity_percentiles_share_ties() -> None:
    got = popularity_percentiles(np.asarray([5.0, 1.0, 1.0, 9.0]))
    np.testing.assert_allclose(got, [2 / 3, 0.5 / 3, 0.5 / 3, 1.0])
    assert len(popularity_percentiles(np.zeros(0))) == 0


def test_reference_file_round_trips_and_refuses_bad_content(tmp_path: Path) -> None:
    path = tmp_path / "drift_reference.json"
    references = {"user_age": Reference(np.asarray([1.0, 2.0]), np.asarray([0.2, 0.3, 0.5]), 9)}
    write_reference(path, references, {"kind": "test"})
    loaded = read_reference(path)
    assert set(loaded) == {"user_age"} and loaded["user_age"].samples == 9
    np.testing.assert_array_equal(loaded["user_age"].edges, [1.0, 2.0])
    body = json.loads(path.read_text())
    body["quantities"]["from_a_request_body"] = body["quantities"]["user_age"]
    path.write_text(json.dumps(body))
    assert set(read_reference(path)) == {"user_age"}  # label values stay a fixed set
    body["quantities"]["user_age"]["edges"] = [2.0, 1.0]
    path.write_text(json.dumps(body))
    with pytest.raises(ArtifactError, match="user_age: edges must increase"):
        read_reference(path)
    path.write_text(json.dumps({**body, "format_version": 99}))
    with pytest.raises(ArtifactError, match="format_version"):
        read_reference(path)
    path.write_text("{not json")
    with pytest.raises(ArtifactError, match="cannot read the drift reference"):
        read_reference(path)
