from __future__ import annotations

import numpy as np
import pytest

from pipelines.errors import ConfigError
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
