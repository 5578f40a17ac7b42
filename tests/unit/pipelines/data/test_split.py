from __future__ import annotations

import numpy as np
import pytest

from core.errors import ConfigError
from pipelines.split import random_split


def test_parts_are_disjoint_cover_everything_and_follow_fractions() -> None:
    split = random_split(10_000, seed=3)
    together = np.concatenate([split.train, split.valid, split.test])
    assert np.array_equal(np.sort(together), np.arange(10_000))
    assert (len(split.train), len(split.valid), len(split.test)) == (8_000, 1_000, 1_000)


def test_seeded() -> None:
    assert np.array_equal(random_split(500, 1).test, random_split(500, 1).test)
    assert not np.array_equal(random_split(500, 1).test, random_split(500, 2).test)


@pytest.mark.parametrize("fractions", [(0.5, 0.5, 0.5), (1.2, -0.1, -0.1), (0.8, 0.2)])
def test_bad_fractions_are_rejected(fractions: tuple[float, ...]) -> None:
    with pytest.raises(ConfigError, match="split fractions"):
        random_split(10, 0, fractions)  # type: ignore[arg-type]


def test_per_user_split_gives_every_user_with_three_rows_a_part_in_each() -> None:
    from pipelines.split import per_user_split

    rng = np.random.default_rng(0)
    users = rng.integers(0, 200, 20_000)
    users[:2] = 500  # a user with two rows: both go to training
    split = per_user_split(users, seed=1)
    together = np.concatenate([split.train, split.valid, split.test])
    assert np.array_equal(np.sort(together), np.arange(len(users)))
    counts = np.bincount(users)
    for part, share in ((split.valid, 0.1), (split.test, 0.1)):
        per_user = np.bincount(users[part], minlength=len(counts))
        enough = counts >= 3
        assert (per_user[enough] >= 1).all()
        assert np.allclose(per_user[enough], np.maximum(np.round(share * counts[enough]), 1))
    assert set(users[split.train]) >= {500} and 500 not in set(users[split.test])


def test_per_user_split_is_seeded_and_random_within_users() -> None:
    from pipelines.split import per_user_split

    users = np.repeat(np.arange(50), 40)
    a, b, c = per_user_split(users, 1), per_user_split(users, 1), per_user_split(users, 2)
    assert np.array_equal(a.test, b.test) and not np.array_equal(a.test, c.test)
    # not the first or last rows of each user: positions inside a user's run vary
    positions = a.test % 40
    assert len(np.unique(positions)) > 20


def test_per_user_split_rejects_bad_fractions() -> None:
    from pipelines.split import per_user_split

    with pytest.raises(ConfigError, match="split fractions"):
        per_user_split(np.zeros(10), 0, (0.5, 0.5, 0.5))


def test_holdout_split_holds_out_the_newest_window_minus_what_production_learnt() -> None:
    from pipelines.split import holdout_split, time_split

    rng = np.random.default_rng(0)
    timestamps = rng.permutation(1000)
    learnt = rng.random(1000) < 0.8
    split = holdout_split(timestamps, learnt, fractions=(0.8, 0.1, 0.1), seed=1)
    window = time_split(timestamps).test
    assert np.array_equal(split.test, np.sort(window[~learnt[window]]))
    together = np.concatenate([split.train, split.valid, split.test])
    assert np.array_equal(np.sort(together), np.arange(1000))
    # what production learnt in the window is the candidate's to learn too
    assert set(window[learnt[window]]) <= set(split.train) | set(split.valid)
    assert len(split.valid) == round(len(np.r_[split.train, split.valid]) / 9)
    # validation is drawn at random, not the newest of the rest
    assert timestamps[split.valid].min() < 500 < timestamps[split.valid].max()
    again = holdout_split(timestamps, learnt, seed=1)
    assert np.array_equal(split.valid, again.valid)


def test_holdout_split_with_nothing_learnt_is_the_time_window() -> None:
    from pipelines.split import holdout_split, time_split

    timestamps = np.arange(100)[::-1]
    split = holdout_split(timestamps, np.zeros(100, bool))
    assert np.array_equal(split.test, time_split(timestamps).test)


def test_holdout_split_needs_one_flag_per_row() -> None:
    from pipelines.split import holdout_split

    with pytest.raises(ValueError, match="one flag per row"):
        holdout_split(np.arange(10), np.zeros(9, bool))
    with pytest.raises(ValueError, match="one flag per row"):
        holdout_split(np.arange(10), np.zeros(10, bool), served=np.zeros(3, bool))
    with pytest.raises(ConfigError, match="split fractions"):
        holdout_split(np.arange(10), np.zeros(10, bool), fractions=(0.5, 0.6, 0.1))


def test_served_rows_never_shrink_the_window_and_nothing_newer_is_trained_on() -> None:
    from pipelines.split import holdout_split, judged_window

    timestamps = np.r_[np.arange(100), np.arange(200, 300)]  # 100 organic, then 100 served
    served = np.r_[np.zeros(100, bool), np.ones(100, bool)]
    learnt = np.zeros(200, bool)
    learnt[[95, 150]] = True  # production learnt these (timestamps 95 and 250)
    window = judged_window(timestamps, served, (0.8, 0.1, 0.1))
    assert sorted(timestamps[window]) == list(range(90, 100))  # newest tenth of the organic
    split = holdout_split(timestamps, learnt, served)
    assert set(split.test.tolist()) == set(range(90, 100)) - {95}  # judged: organic rows only
    trained = np.r_[split.train, split.valid]
    assert timestamps[trained].max() == 250 and 95 in trained  # only what production learnt
    assert len(trained) + len(split.test) == 200 - 99  # 99 served rows: in no part
