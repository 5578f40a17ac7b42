from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from core.errors import ConfigError
from pipelines.split import hashed_split, holdout_split, random_split, row_draws


def _rows(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "user_id": rng.integers(0, 300, n),
            "item_id": rng.integers(0, 500, n),
            "timestamp": rng.integers(0, 10**9, n),
        }
    )


def _parts(n: int, split) -> np.ndarray:  # type: ignore[no-untyped-def]
    part = np.full(n, -1)
    part[split.train], part[split.valid], part[split.test] = 0, 1, 2
    return part


def test_hashed_split_covers_every_row_once_at_the_fractions_in_expectation() -> None:
    rows = _rows(20_000)
    split = hashed_split(rows, seed=3)
    together = np.concatenate([split.train, split.valid, split.test])
    assert np.array_equal(np.sort(together), np.arange(20_000))
    for part, share in ((split.train, 0.8), (split.valid, 0.1), (split.test, 0.1)):
        sd = np.sqrt(20_000 * share * (1 - share))
        assert abs(len(part) - share * 20_000) < 4 * sd


def test_adding_or_removing_one_row_changes_no_other_rows_assignment() -> None:
    rows = _rows(5_000)
    before = _parts(5_000, hashed_split(rows, seed=7))
    extra = pd.DataFrame({"user_id": [1], "item_id": [2], "timestamp": [123]})
    for grown in (
        pd.concat([rows, extra], ignore_index=True),  # appended
        pd.concat([extra, rows], ignore_index=True),
    ):  # or first: positions shift
        after = _parts(len(grown), hashed_split(grown, seed=7))
        offset = 1 if grown.iloc[0].equals(extra.iloc[0]) else 0
        assert np.array_equal(after[offset : offset + 5_000], before)
    shrunk = rows.drop(index=1234).reset_index(drop=True)
    after = _parts(len(shrunk), hashed_split(shrunk, seed=7))
    assert np.array_equal(after, np.delete(before, 1234))
    # the permutation split of older versions moved hundreds of other rows
    old = _parts(5_000, random_split(5_000, 7))
    moved = _parts(5_001, random_split(5_001, 7))[:5_000] != old
    assert moved.sum() > 100


def test_hashed_split_is_seeded_and_reads_string_ids() -> None:
    rows = _rows(2_000)
    assert np.array_equal(hashed_split(rows, 1).test, hashed_split(rows, 1).test)
    assert not np.array_equal(hashed_split(rows, 1).test, hashed_split(rows, 2).test)
    named = rows.assign(user_id="u" + rows["user_id"].astype(str))
    draws = row_draws(named, 1)
    assert np.array_equal(draws, row_draws(named.iloc[::-1], 1)[::-1])  # order-free
    assert draws.min() >= 0 and draws.max() < 1
    with pytest.raises(ConfigError, match="needs the columns"):
        row_draws(rows.drop(columns="item_id"), 1)


def test_the_retrains_validation_draw_moves_no_other_row_when_a_row_is_added() -> None:
    rows = _rows(3_000)
    learnt = np.random.default_rng(1).random(3_000) < 0.8
    stamps = rows["timestamp"].to_numpy()
    before = _parts(3_000, holdout_split(stamps, learnt, seed=2, keys=rows))
    old = rows.iloc[[int(np.argmin(stamps))]].assign(item_id=10**6)  # an old, unrelated row
    grown = pd.concat([rows, old], ignore_index=True)
    after = holdout_split(grown["timestamp"].to_numpy(), np.r_[learnt, True], seed=2, keys=grown)
    assert np.array_equal(_parts(3_001, after)[:3_000], before)
    with pytest.raises(ValueError, match="one row per row"):
        holdout_split(stamps, learnt, keys=rows.iloc[:10])


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
    rest = len(np.r_[split.train, split.valid])
    assert abs(len(split.valid) - rest / 9) < 4 * np.sqrt(rest / 9)  # 1:8 in expectation
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
