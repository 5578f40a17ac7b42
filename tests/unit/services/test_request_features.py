"""A request's model inputs: the user encoded once, only request-time ops on the rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core.features.ops import Standardize, Temporal
from core.features.schema import MOVIELENS
from services.serving.context import RequestContext
from services.serving.release import Release, load_release
from services.stores.base import UserRecord


@pytest.fixture(scope="module")
def release(exported: Path) -> Release:
    return load_release(exported)


def _ctx(release: Release, user: UserRecord | None) -> RequestContext:
    ctx = RequestContext(
        user_id=user.user_id if user else 10**9,
        k=10,
        timestamp=1_700_000_000,
        model_version=release.version,
    )
    ctx.user = user
    return ctx


def _user(release: Release, recent: np.ndarray) -> UserRecord:
    attributes = {"age": "30", "gender": "M", "occupation": "writer", "zip_code": "00042"}
    return UserRecord(7, attributes, recent=recent, seen=release.item_ids[:3])


@pytest.mark.parametrize("recent_count", [0, 5, 40])
def test_query_inputs_equal_a_full_transform_of_the_user_and_history(
    release: Release, recent_count: int
) -> None:
    """The tower's inputs as training built them: the user's encoded id-features and the
    last ``history_length`` items (unknown ids included), left-padded with 0."""
    recent = np.concatenate([release.item_ids[:recent_count], [10**12]])[-recent_count:]
    if recent_count == 0:
        recent = release.item_ids[:0]
    ctx = _ctx(release, _user(release, recent))
    features, history = release.features.query_inputs(ctx)
    assert ctx.user is not None
    raw = {"user_id": np.asarray([7])}
    raw.update({k: np.asarray([v], dtype=object) for k, v in ctx.user.attributes.items()})
    full = release.workflow.transform(raw, partial=True)
    np.testing.assert_array_equal(
        features, np.stack([full[c] for c in MOVIELENS.user_tower_columns], 1)
    )
    length = int(release.manifest["config"]["history_length"])
    expected = np.zeros((1, length), dtype=np.int64)
    kept = recent[-length:]
    if len(kept):
        ids = release.workflow.transform({"item_id": kept}, partial=True)["item_id_idx"]
        expected[0, length - len(kept) :] = ids
    assert history.shape == (1, length)
    np.testing.assert_array_equal(history, expected)
    if recent_count == 40:
        assert history[0, -1] == 1  # the unknown id: the out-of-vocabulary bucket


def test_the_user_is_encoded_once_per_request(
    release: Release, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[set[str]] = []
    transform = release.workflow.transform

    def counting(columns: dict, **kwargs: bool) -> dict:
        calls.append(set(columns))
        return transform(columns, **kwargs)

    monkeypatch.setattr(release.workflow, "transform", counting)
    ctx = _ctx(release, _user(release, release.item_ids[:5]))
    ctx.candidates = release.popularity[:20]
    release.features.query_inputs(ctx)
    release.features.ranking_inputs(ctx)
    assert calls == [{"user_id", "age", "gender", "occupation", "zip_code"}]


def test_only_request_time_ops_run_on_the_rows(release: Release) -> None:
    """Event time and standardisation need both sides; everything else was encoded before.
    The rows carry no raw item attributes the remaining ops do not read."""
    features = release.features
    assert [type(op) for op in features.request_ops] == [Temporal, Standardize]
    assert "genres" not in features.item_columns  # raw strings: encoded once at load
    assert "year" in features.item_columns  # the item's age needs it at request time
