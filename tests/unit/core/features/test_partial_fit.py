"""Statistics from parts, merged: fitting on parts of the rows equals fitting on all of them."""

from __future__ import annotations

import math
from fractions import Fraction
from itertools import pairwise

import numpy as np
import pytest

from core.features.ops import Categorify, Columns, FeatureOp, MultiHot, Standardize, TargetEncode
from core.features.ops.exact_sum import ExactSums
from core.features.rows import AttributeTable, labelled_rows
from core.features.spec import build_workflow
from pipelines.data.schema import RawDataset


def _cuts(rows: int, parts: int, seed: int) -> list[slice]:
    """``parts`` contiguous slices of uneven sizes (one may be empty)."""
    bounds = np.sort(np.random.default_rng(seed).integers(0, rows + 1, parts - 1))
    edges = [0, *bounds.tolist(), rows]
    return [slice(a, b) for a, b in pairwise(edges)]


def _same_state(a: FeatureOp, b: FeatureOp) -> None:
    left, right = a.arrays(), b.arrays()
    assert left.keys() == right.keys()
    for name in left:
        assert left[name].dtype == right[name].dtype, name
        np.testing.assert_array_equal(left[name], right[name], err_msg=f"{a.kind}/{name}")


def test_exact_sums_are_the_correctly_rounded_sums_whatever_the_parts() -> None:
    rng = np.random.default_rng(0)
    values = rng.normal(size=20_001) * 10.0 ** rng.integers(-30, 30, 20_001)
    keys = rng.integers(0, 7, len(values))
    whole = ExactSums.of(keys, values, 7)
    parts = [ExactSums.of(keys[s], values[s], 7) for s in _cuts(len(values), 5, 1)]
    merged = ExactSums.merge(parts[::-1])
    expected = [math.fsum(values[keys == k]) for k in range(7)]
    assert whole.floats().tolist() == expected
    assert merged.floats().tolist() == expected
    assert merged.fractions() == [
        sum(map(Fraction, values[keys == k]), Fraction(0)) for k in range(7)
    ]
    with pytest.raises(ValueError, match="finite"):
        ExactSums.of(np.zeros(1, np.int64), np.array([np.nan]), 1)


def test_fold_draws_in_parts_are_the_draws_of_all_rows() -> None:
    op = TargetEncode("id", "label", seed=3)
    whole = op.draw_folds(op.fold_generator(), 100_003)
    generator = op.fold_generator()
    parts = [op.draw_folds(generator, s.stop - s.start) for s in _cuts(100_003, 7, 2)]
    np.testing.assert_array_equal(np.concatenate(parts), whole)


@pytest.mark.parametrize(("parts", "streamed"), [(2, False), (5, False), (5, True)])
def test_workflow_fitted_from_parts_equals_the_whole_fit(
    small_dataset: RawDataset, parts: int, streamed: bool
) -> None:
    schema = small_dataset.schema
    users = AttributeTable(small_dataset.users, "user_id", schema.user_attributes)
    items = AttributeTable(small_dataset.items, "item_id", schema.item_attributes)
    rows = labelled_rows(small_dataset.interactions, users, items)
    whole = build_workflow(schema)
    expected = whole.fit_transform(rows)

    pieces: list[Columns] = [
        {k: v[s] for k, v in rows.items()} for s in _cuts(len(rows["label"]), parts, 3)
    ]
    fitted = build_workflow(schema)
    draws = {id(op): op.fold_generator() for op in fitted.ops if isinstance(op, TargetEncode)}
    for op in fitted.ops:  # one op at a time: later ops read earlier ops' training outputs
        folds = [
            op.draw_folds(draws[id(op)], len(p[op.inputs[0]]))
            if isinstance(op, TargetEncode)
            else None
            for p in pieces
        ]
        if isinstance(op, TargetEncode):
            summaries = [op.partial_fit(p, f) for p, f in zip(pieces, folds, strict=True)]
        else:
            summaries = [op.partial_fit(p) for p in pieces]
        if streamed:  # one running summary, merged part after part (the streaming prepare)
            running = summaries[0]
            for summary in summaries[1:]:
                running = op.merge([running, summary])
            summaries = [running]
        op.combine(summaries)
        if isinstance(op, TargetEncode):
            outputs = [op.out_of_fold(p, f) for p, f in zip(pieces, folds, strict=True)]
        else:
            outputs = [op.transform(p) for p in pieces]
        for piece, out in zip(pieces, outputs, strict=True):
            piece.update(out)
    for a, b in zip(whole.ops, fitted.ops, strict=True):
        _same_state(a, b)
    for column in expected:
        joined = np.concatenate([p[column] for p in pieces])
        np.testing.assert_array_equal(joined, expected[column], err_msg=column)


def test_merged_vocabularies_keep_sorted_order_and_the_frequency_cut() -> None:
    values = np.array(["b", "a", "c", "a", None, "b", "d", "a"], dtype=object)
    whole, parted = Categorify("x", min_frequency=2), Categorify("x", min_frequency=2)
    whole.fit({"x": values})
    parted.combine([parted.partial_fit({"x": values[s]}) for s in (slice(0, 3), slice(3, 8))])
    assert parted.vocabulary is not None and parted.vocabulary.tolist() == ["a", "b"]
    _same_state(whole, parted)
    genres = MultiHot("g")
    genres.combine([genres.partial_fit({"g": np.array(["x|y", ""], dtype=object)}), set()])
    assert genres.vocabulary is not None and genres.vocabulary.tolist() == ["x", "y"]


def test_standardize_is_the_exact_mean_and_std_and_needs_rows() -> None:
    rng = np.random.default_rng(5)
    column = (rng.normal(size=50_000) * 3 + 1970).astype(np.float32)
    op = Standardize(["v"], "out")
    op.fit({"v": column})
    exact = np.asarray(column, dtype=np.float64)
    assert op.mean is not None and op.scale is not None
    total = sum(map(Fraction, exact.tolist()), Fraction(0))
    assert op.mean[0] == np.float32(float(total / len(exact)))
    assert abs(float(op.scale[0]) - float(exact.std())) <= 1e-6 * float(exact.std())
    with pytest.raises(ValueError, match="at least one training row"):
        Standardize(["v"], "out").fit({"v": np.zeros(0, np.float32)})


def test_out_of_fold_needs_folded_summaries() -> None:
    op = TargetEncode("id", "label")
    columns = {"id": np.array([0, 1, 1]), "label": np.array([1.0, 0.0, 1.0])}
    op.fit(columns)
    with pytest.raises(ValueError, match="with folds"):
        op.out_of_fold(columns, np.zeros(3, np.int8))
