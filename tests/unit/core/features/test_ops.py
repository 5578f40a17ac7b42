from __future__ import annotations

import numpy as np
import pytest

from core.features.ops import (
    Categorify,
    CountEncode,
    GroupMean,
    MultiHot,
    Standardize,
    TargetEncode,
    Temporal,
)
from core.features.ops.categorify import NULL_ID, OOV_ID


def test_categorify_buckets_null_oov_and_rare_values() -> None:
    op = Categorify("city", min_frequency=2)
    op.fit({"city": np.array(["b", "a", "b", "a", "rare", None], dtype=object)})
    out = op.transform({"city": np.array(["a", "b", "rare", "never", None, ""], dtype=object)})
    assert out["city_idx"].tolist() == [2, 3, OOV_ID, OOV_ID, NULL_ID, NULL_ID]
    assert op.cardinality == 4


def test_categorify_numeric_accepts_strings_from_a_store() -> None:
    op = Categorify("age", numeric=True)
    op.fit({"age": np.array([20, 30, 30, 41])})
    from_store = op.transform({"age": np.array(["30", "20", "", "99"], dtype=object)})
    assert from_store["age_idx"].tolist() == [3, 2, NULL_ID, OOV_ID]
    missing = np.array([None, "None", "nan", np.nan, "41"], dtype=object)
    assert op.transform({"age": missing})["age_idx"].tolist() == [NULL_ID] * 4 + [4]
    assert op.transform({"age": np.array([np.nan])})["age_idx"].tolist() == [NULL_ID]


def test_categorify_rejects_min_frequency_below_one() -> None:
    with pytest.raises(ValueError, match="min_frequency"):
        Categorify("x", min_frequency=0)


def test_transform_names_a_missing_input_column() -> None:
    op = CountEncode("user_idx")
    op.fit({"user_idx": np.array([2, 2, 3])})
    with pytest.raises(KeyError, match="user_idx"):
        op.transform({"other": np.array([1])})


def test_count_encode_uses_training_counts_and_zero_for_unseen() -> None:
    op = CountEncode("u")
    op.fit({"u": np.array([2, 2, 2, 3])})
    out = op.transform({"u": np.array([2, 3, 4, 99])})["u_count"]
    np.testing.assert_allclose(out, np.log1p([3, 1, 0, 0]))


def test_target_encode_is_out_of_fold_on_training_rows() -> None:
    """Flipping one training row's label must not change that row's own encoding."""
    rng = np.random.default_rng(0)
    ids = rng.integers(2, 6, 400)
    labels = rng.integers(0, 2, 400).astype(np.float32)
    first = TargetEncode("u", "y", folds=5, seed=1).fit_transform({"u": ids, "y": labels})["u_te_y"]
    flipped = labels.copy()
    flipped[10] = 1 - flipped[10]
    second = TargetEncode("u", "y", folds=5, seed=1).fit_transform({"u": ids, "y": flipped})[
        "u_te_y"
    ]
    assert first[10] == second[10]
    assert not np.array_equal(first, second)  # other folds did see it


def test_target_encode_transform_uses_all_training_rows_and_prior_for_unseen() -> None:
    op = TargetEncode("u", "y", smoothing=0.0)
    op.fit({"u": np.array([2, 2, 3, 3]), "y": np.array([1.0, 1.0, 0.0, 1.0])})
    out = op.transform({"u": np.array([2, 3, 7])})["u_te_y"]
    np.testing.assert_allclose(out, [1.0, 0.5, 0.75])


def test_target_encode_needs_two_folds() -> None:
    with pytest.raises(ValueError, match="at least 2 folds"):
        TargetEncode("u", "y", folds=1)


def test_temporal_features_of_a_known_time() -> None:
    # 2021-03-04 05:06:07 UTC was a Thursday
    out = Temporal().transform({"timestamp": np.array([1614834367]), "year": np.array([2001.0])})
    assert out["hour"].tolist() == [5]
    assert out["weekday"].tolist() == [3]
    assert out["item_age_years"][0] == pytest.approx(20.17, abs=0.01)
    unknown_year = Temporal().transform(
        {"timestamp": np.array([1614834367]), "year": np.array([np.nan])}
    )
    assert unknown_year["item_age_years"].tolist() == [0.0]


def test_multi_hot_and_first_value() -> None:
    op = MultiHot("genres")
    op.fit({"genres": np.array(["Drama|Comedy", "Action"], dtype=object)})
    out = op.transform({"genres": np.array(["Comedy|Drama", "", "Horror|Action"], dtype=object)})
    # vocabulary sorted: Action, Comedy, Drama
    assert out["genres_multi_hot"].tolist() == [[0, 1, 1], [0, 0, 0], [1, 0, 0]]
    assert out["genres_first_idx"].tolist() == [2, 0, 1]


def test_group_mean_ignores_missing_values_and_defaults_to_global_mean() -> None:
    op = GroupMean("u", "year", "mean_year")
    op.fit({"u": np.array([2, 2, 3]), "year": np.array([1990.0, np.nan, 2000.0])})
    out = op.transform({"u": np.array([2, 3, 9])})["mean_year"]
    np.testing.assert_allclose(out, [1990.0, 2000.0, 1995.0])


def test_standardize_stacks_and_scales() -> None:
    op = Standardize(["a", "b"], "dense")
    columns = {"a": np.array([1.0, 3.0]), "b": np.array([5.0, 5.0])}
    op.fit(columns)
    out = op.transform(columns)["dense"]
    np.testing.assert_allclose(out, [[-1.0, 0.0], [1.0, 0.0]])


def _columns_of_many_rows(rng: np.random.Generator, rows: int) -> dict[str, np.ndarray]:
    """Columns long enough for the ops' distinct-value path, with every awkward value."""
    pick = lambda choices: np.array(  # noqa: E731
        [choices[i] for i in rng.integers(len(choices), size=rows)], dtype=object
    )
    return {
        "ids": rng.integers(0, 500, size=rows),
        "text": pick(["a", "b", "", "None", None, np.nan, "zz"]),
        "unicode": np.array(["x", "y", "", "xy"])[rng.integers(4, size=rows)],
        "mixed": pick([1, 1.0, True, "1", None, 2]),
        "floats": np.array([0.0, -0.0, 1.5, np.nan])[rng.integers(4, size=rows)],
        "numeric_text": pick(["30", "", None, np.nan, 41, 20.0, "None", "41"]),
        "genres": pick(["A|B", "B", "", None, "C|A", "A|B"]),
    }


@pytest.mark.parametrize(
    ("column", "numeric", "min_frequency"),
    [
        ("ids", False, 1),
        ("ids", False, 30),
        ("text", False, 1),
        ("unicode", False, 1),
        ("mixed", False, 1),
        ("floats", False, 1),
        ("numeric_text", True, 1),
        ("floats", True, 2),
    ],
)
def test_categorify_of_many_rows_equals_it_row_by_row(
    monkeypatch: pytest.MonkeyPatch, column: str, numeric: bool, min_frequency: int
) -> None:
    """A large batch encodes each distinct value once: the vocabulary and every id must be
    those of encoding the rows directly."""
    from core.features.ops import distinct

    columns = _columns_of_many_rows(np.random.default_rng(0), 3 * distinct.MIN_ROWS)
    fast = Categorify(column, min_frequency, numeric)
    fast.fit(columns)
    ids = fast.transform(columns)[f"{column}_idx"]
    monkeypatch.setattr(distinct, "MIN_ROWS", 10**9)
    direct = Categorify(column, min_frequency, numeric)
    direct.fit(columns)
    assert fast.vocabulary is not None and direct.vocabulary is not None
    assert fast.vocabulary.dtype == direct.vocabulary.dtype
    assert fast.vocabulary.tolist() == direct.vocabulary.tolist()
    assert ids.tolist() == direct.transform(columns)[f"{column}_idx"].tolist()


def test_multi_hot_of_many_rows_equals_it_row_by_row(monkeypatch: pytest.MonkeyPatch) -> None:
    from core.features.ops import distinct

    columns = _columns_of_many_rows(np.random.default_rng(1), 3 * distinct.MIN_ROWS)
    fast = MultiHot("genres")
    fast.fit(columns)
    out = fast.transform(columns)
    monkeypatch.setattr(distinct, "MIN_ROWS", 10**9)
    direct = MultiHot("genres")
    direct.fit(columns)
    assert fast.vocabulary is not None and direct.vocabulary is not None
    assert fast.vocabulary.tolist() == direct.vocabulary.tolist()
    expected = direct.transform(columns)
    for name, values in out.items():
        np.testing.assert_array_equal(values, expected[name])


def test_distinct_values_gather_back_to_the_rows_and_never_merge_texts() -> None:
    from core.features.ops.distinct import MIN_ROWS, distinct

    columns = _columns_of_many_rows(np.random.default_rng(2), 2 * MIN_ROWS)
    for name in ("ids", "text", "unicode", "genres"):
        found = distinct(columns[name])
        assert found is not None, name
        uniques, codes = found
        assert uniques[codes].astype(str).tolist() == columns[name].astype(str).tolist()
    # 1 == 1.0 == True and 0.0 == -0.0, but their texts differ: not for a text key
    assert distinct(columns["mixed"]) is None
    assert distinct(columns["floats"]) is None
    assert distinct(columns["floats"], exact_text=False) is not None
    assert distinct(columns["ids"][: MIN_ROWS - 1]) is None  # a small batch: encoded directly


def test_integer_ids_are_looked_up_as_their_text_would_be() -> None:
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 50_000, 20_000)
    plain = Categorify("user_id")
    plain.fit({"user_id": ids[:10_000]})
    by_text = plain._ids(ids.astype(str).astype(object))  # the text path, row by row
    np.testing.assert_array_equal(plain.transform({"user_id": ids})["user_id_idx"], by_text)
    assert plain._integers is not False and plain._integers is not None
    odd = Categorify("user_id")  # "007" is not how 7 is written: the text path decides
    odd.fit({"user_id": np.array(["007", "12", *map(str, range(20, 5_000))], dtype=object)})
    column = np.array([7, 12, *range(20, 5_000)] * 2)
    encoded = odd.transform({"user_id": column})["user_id_idx"]
    np.testing.assert_array_equal(encoded, odd._ids(column.astype(str).astype(object)))
    assert encoded[0] == OOV_ID and encoded[1] > OOV_ID  # 7 is not "007"; 12 is "12"
    assert odd._integers is False
    odd.vocabulary = np.array(["7"])  # a new vocabulary is looked at again
    assert odd._integers is None
