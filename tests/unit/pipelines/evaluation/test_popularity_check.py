"""The beats-popularity check and its enforcement."""

from __future__ import annotations

import pytest

from pipelines.evaluation.popularity_check import (
    BelowPopularityError,
    enforce,
    popularity_check,
    with_override,
)


def test_a_model_above_popularity_passes() -> None:
    check = popularity_check("two_tower", 0.3, "popularity", 0.2, "ndcg@10", allowed=False)
    assert check["passed"] and not check["overridden"]
    enforce([check])


@pytest.mark.parametrize("value", [0.2, 0.1])
def test_a_model_at_or_below_popularity_is_blocked_with_the_numbers(value: float) -> None:
    check = popularity_check("two_tower", value, "popularity", 0.2, "ndcg@10", allowed=False)
    assert not check["passed"]
    with pytest.raises(BelowPopularityError) as error:
        enforce([check, popularity_check("ranker", 0.8, "popularity", 0.7, "auc", False)])
    message = str(error.value)
    assert "two_tower does NOT beat popularity on valid ndcg@10" in message
    assert f"{value:.4f} vs 0.2000" in message and "--allow-below-popularity" in message
    assert "ranker" not in message


def test_the_override_is_recorded_and_lets_it_through() -> None:
    check = popularity_check("ranker", 0.6, "popularity", 0.7, "auc", allowed=True)
    assert not check["passed"] and check["overridden"]
    enforce([check])


def test_an_override_given_later_applies_only_to_failed_checks() -> None:
    failed = popularity_check("two_tower", 0.1, "popularity", 0.2, "ndcg@10", allowed=False)
    passed = popularity_check("ranker", 0.8, "popularity", 0.7, "auc", allowed=False)
    assert [c["overridden"] for c in with_override([failed, passed], True)] == [True, False]
    assert [c["overridden"] for c in with_override([failed, passed], False)] == [False, False]
