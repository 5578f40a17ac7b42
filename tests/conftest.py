"""Shared fixtures: small datasets made in the test, never downloaded."""

from __future__ import annotations

import pytest

from pipelines.data.schema import RawDataset
from pipelines.data.synthetic import make_synthetic


@pytest.fixture(scope="session")
def small_dataset() -> RawDataset:
    """A few thousand synthetic interactions in the MovieLens schema."""
    return make_synthetic(n_users=300, n_items=400, n_interactions=12_000, seed=7)
