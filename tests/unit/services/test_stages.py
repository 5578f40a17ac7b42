from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from services.metrics import RETRIEVED
from services.serving.context import RequestContext
from services.serving.release import Release, load_release
from services.serving.rules import Boost, Diversity, Exclusion, Pin, Rules
from services.settings import BreakerSettings
from services.stages.filtering import FilteringStage
from services.stages.ordering import OrderingStage, diversity_order
from services.stages.retrieval import RetrievalStage
from services.stages.scoring import ScoringStage
from services.stores.base import UserRecord
from services.util.resilience import CircuitBreaker
from tests.unit.services.fakes import FaultyBackend


@pytest.fixture(scope="module")
def release(exported: Path) -> Release:
    return load_release(exported)


def _ctx(release: Release, k: int = 10, user: UserRecord | None = None) -> RequestContext:
    ctx = RequestContext(
        user_id=user.user_id if user else 10**9,
        k=k,
        timestamp=1_700_000_000,
        model_version=release.version,
    )
    ctx.user = user
    return ctx


def _user(release: Release, seen: int = 30) -> UserRecord:
    return UserRecord(
        7,
        {"age": "30", "gender": "M", "occupation": "writer", "zip_code": "00042"},
        recent=release.item_ids[:5],
        seen=release.item_ids[release.popularity[:seen]],
    )


def _breaker() -> CircuitBreaker:
    return CircuitBreaker("triton", BreakerSettings(failures=100))


async def _backend(exported: Path, release: Release, mode: str = "ok") -> FaultyBackend:
    backend = FaultyBackend(exported / "model_repository", mode)
    await backend.start([release.version])
    return backend


async def test_retrieval_searches_the_index_for_a_known_user(
    exported: Path, release: Release
) -> None:
    stage = RetrievalStage(
        {release.version: release}, await _backend(exported, release), _breaker(), 1.0, 50
    )
    ctx = await stage(_ctx(release, user=_user(release)))
    assert len(ctx.candidates) == 50 and not ctx.degraded
    assert np.all(np.diff(ctx.retrieval_scores) <= 1e-6)  # best first
    assert not np.array_equal(ctx.candidates, release.popularity[:50])


async def test_retrieval_spends_its_budget_on_items_the_user_has_not_seen(
    exported: Path, release: Release
) -> None:
    stage = RetrievalStage(
        {release.version: release}, await _backend(exported, release), _breaker(), 1.0, 50
    )
    user = _user(release, seen=0)
    deep = RetrievalStage(
        {release.version: release}, await _backend(exported, release), _breaker(), 1.0, 90
    )
    ranked = (await deep(_ctx(release, user=user))).candidates  # the ANN's first 90
    user.seen = release.item_ids[ranked[:40]]  # the user has seen the ANN's 40 best
    ctx = await stage(_ctx(release, user=user))
    assert ctx.candidates.tolist() == ranked[40:90].tolist()
    ctx = await FilteringStage({release.version: release})(ctx)
    assert len(ctx.candidates) == 50 and not ctx.degraded  # nothing filled from popularity


async def test_retrieval_gives_popularity_to_unknown_users(
    exported: Path, release: Release
) -> None:
    stage = RetrievalStage(
        {release.version: release}, await _backend(exported, release), _breaker(), 1.0, 50
    )
    ctx = await stage(_ctx(release))
    assert np.array_equal(ctx.candidates, release.popularity[:50]) and not ctx.degraded


@pytest.mark.parametrize(
    ("mode", "reason"), [("raise", "error"), ("nan", "bad_scores"), ("wrong_shape", "bad_scores")]
)
async def test_retrieval_without_the_query_tower_gives_the_history_neighbours_then_popularity(
    exported: Path, release: Release, mode: str, reason: str
) -> None:
    stage = RetrievalStage(
        {release.version: release}, await _backend(exported, release, mode), _breaker(), 1.0, 300
    )
    user = _user(release)
    ctx = await stage(_ctx(release, user=user))
    assert ctx.reasons == [f"retrieval:{reason}"]
    assert release.neighbors is not None
    seen = release.positions(user.seen)
    expected, _ = release.neighbors.candidates(release.positions(user.recent), 300, seen)
    assert 0 < len(expected) <= 250 < 300  # 5 recent items x 50 neighbours at most
    assert np.array_equal(ctx.candidates[: len(expected)], expected)
    rest = ctx.candidates[len(expected) :]
    assert np.array_equal(
        rest, release.popularity[~np.isin(release.popularity, expected)][: len(rest)]
    )
    assert len(ctx.candidates) == 300 and len(np.unique(ctx.candidates)) == 300
    assert np.all(np.diff(ctx.retrieval_scores) <= 0)  # neighbours above popularity
    # a user with no recent items (or a release without the table) gets popularity alone
    ctx = await stage(_ctx(release, user=UserRecord(7, {}, recent=[], seen=[])))
    assert np.array_equal(ctx.candidates, release.popularity[:300])
    bare = dataclasses.replace(release, neighbors=None, embeddings=None)
    stage.releases = {release.version: bare}
    ctx = await stage(_ctx(bare, user=user))
    assert np.array_equal(ctx.candidates, release.popularity[:300])


async def test_retrieval_adds_the_neighbours_the_ann_did_not_find_within_the_budget(
    exported: Path, release: Release
) -> None:
    backend = await _backend(exported, release)
    alone = RetrievalStage({release.version: release}, backend, _breaker(), 1.0, 50)
    both = RetrievalStage({release.version: release}, backend, _breaker(), 1.0, 50, 20)
    user = _user(release)
    ann = (await alone(_ctx(release, user=user))).candidates
    before = {s: RETRIEVED.labels(source=s)._value.get() for s in ("ann", "item_neighbors")}
    ctx = await both(_ctx(release, user=user))
    assert release.neighbors is not None and release.embeddings is not None
    seen = release.positions(user.seen)
    extra, _ = release.neighbors.candidates(release.positions(user.recent), 20, seen)
    added = extra[~np.isin(extra, ann)]
    assert len(added) > 0 and len(ctx.candidates) == 50 and len(np.unique(ctx.candidates)) == 50
    assert set(ctx.candidates) == set(ann[: 50 - len(added)]) | set(added)
    assert np.all(np.diff(ctx.retrieval_scores) <= 0)  # merged, best first
    query = await backend.encode_query(release.version, *release.features.query_inputs(ctx))
    expected = release.embeddings[ctx.candidates] @ np.asarray(query, np.float32)[0]
    assert np.allclose(ctx.retrieval_scores, expected, atol=1e-4)  # one meaning for all
    counted = {s: RETRIEVED.labels(source=s)._value.get() - before[s] for s in before}
    assert counted == {"ann": 50 - len(added), "item_neighbors": len(added)}
    assert not ctx.degraded


async def test_filtering_removes_seen_unavailable_excluded_and_duplicates(release: Release) -> None:
    user = _user(release, seen=20)
    ctx = _ctx(release, k=5, user=user)
    ctx.candidates = np.r_[release.popularity[:40], release.popularity[25:30]]  # duplicates
    ctx.retrieval_scores = np.linspace(1, 0, len(ctx.candidates)).astype(np.float32)
    ctx.unavailable = release.item_ids[release.popularity[[20, 21]]]
    ctx.exclude = release.item_ids[release.popularity[[22]]]
    ctx = await FilteringStage({release.version: release})(ctx)
    kept = set(ctx.candidates.tolist())
    assert kept == set(release.popularity[23:40].tolist())
    assert len(ctx.candidates) == len(kept) and not ctx.degraded


async def test_filtering_fills_from_popularity_without_seen_or_duplicates(release: Release) -> None:
    user = _user(release, seen=10)
    ctx = _ctx(release, k=30, user=user)
    ctx.candidates = release.popularity[5:15]  # half of them seen
    ctx.retrieval_scores = np.ones(10, np.float32)
    ctx = await FilteringStage({release.version: release})(ctx)
    assert len(ctx.candidates) == 30 and len(set(ctx.candidates.tolist())) == 30
    assert not set(ctx.candidates.tolist()) & set(release.popularity[:10].tolist())
    assert ctx.reasons == ["filtering:too_few_candidates"]


async def test_genre_exclusion_applies_only_to_young_users(release: Release) -> None:
    genre = release.primary_genre[release.popularity[0]]
    rules = Rules(exclude=[Exclusion(genres=[genre], max_user_age=17)])
    young, adult = _user(release, seen=0), _user(release, seen=0)
    young.attributes["age"], adult.attributes["age"] = "12", "40"
    for user, expect_genre in ((young, False), (adult, True)):
        ctx = _ctx(release, k=5, user=user)
        ctx.candidates = release.popularity[:50].copy()
        ctx.retrieval_scores = np.ones(50, np.float32)
        ctx = await FilteringStage({release.version: dataclasses.replace(release, rules=rules)})(
            ctx
        )
        has_genre = any(genre in g.split("|") for g in release.genres[ctx.candidates])
        assert has_genre is expect_genre


async def test_scoring_replaces_retrieval_scores_with_model_scores(
    exported: Path, release: Release
) -> None:
    stage = ScoringStage(
        {release.version: release}, await _backend(exported, release), _breaker(), 1.0
    )
    ctx = _ctx(release, user=_user(release))
    ctx.candidates, ctx.retrieval_scores = release.popularity[:40], np.ones(40, np.float32)
    ctx = await stage(ctx)
    assert (
        ctx.scores.shape == (40,)
        and np.all((ctx.scores > 0) & (ctx.scores < 1))
        and not ctx.degraded
    )


@pytest.mark.parametrize(
    ("mode", "reason"), [("nan", "bad_scores"), ("wrong_shape", "bad_scores"), ("raise", "error")]
)
async def test_scoring_keeps_retrieval_order_on_bad_output(
    exported: Path, release: Release, mode: str, reason: str
) -> None:
    stage = ScoringStage(
        {release.version: release}, await _backend(exported, release, mode), _breaker(), 1.0
    )
    ctx = _ctx(release, user=_user(release))
    ctx.candidates, ctx.retrieval_scores = (
        release.popularity[:40],
        np.linspace(1, 0, 40).astype(np.float32),
    )
    ctx = await stage(ctx)
    assert np.array_equal(ctx.scores, ctx.retrieval_scores) and ctx.reasons == [f"scoring:{reason}"]


async def test_ordering_applies_boost_diversity_pin_and_cuts_to_k(release: Release) -> None:
    positions = release.popularity[:60].copy()
    scores = np.linspace(1.0, 0.5, 60).astype(np.float32)
    last = int(positions[-1])
    pinned_id = int(release.item_ids[release.popularity[100]])
    rules = Rules(
        boosts=[
            Boost(
                item_ids=[int(release.item_ids[last])],
                factor=10.0,
                start=dt.date(2023, 1, 1),
                end=dt.date(2024, 1, 1),
            )
        ],
        diversity=Diversity(max_per_genre=2),
        pinned=[Pin(item_id=pinned_id, position=1)],
    )
    ctx = _ctx(release, k=8)
    ctx.candidates, ctx.scores = positions, scores
    ctx = await OrderingStage({release.version: dataclasses.replace(release, rules=rules)})(ctx)
    assert len(ctx.candidates) == 8
    assert ctx.candidates[0] == last  # boosted x10 inside its date range (ctx time is 2023-11)
    assert release.item_ids[ctx.candidates[1]] == pinned_id
    assert np.all(np.diff(ctx.scores) <= 0)
    genres = release.primary_genre[np.delete(ctx.candidates, 1)]
    assert max(np.unique(genres, return_counts=True)[1]) <= 2


async def test_a_banned_item_is_never_pinned(release: Release) -> None:
    pinned = int(release.popularity[100])
    rules = Rules(pinned=[Pin(item_id=int(release.item_ids[pinned]), position=0)])
    ctx = _ctx(release, k=5)
    ctx.candidates, ctx.scores = (
        release.popularity[:10].copy(),
        np.linspace(1, 0, 10).astype(np.float32),
    )
    ctx.banned = np.array([pinned])
    ctx = await OrderingStage({release.version: dataclasses.replace(release, rules=rules)})(ctx)
    assert pinned not in ctx.candidates.tolist()


def test_diversity_order_keeps_the_first_items_of_each_genre() -> None:
    genres = np.array(["a", "a", "b", "a", "b", "a", "c"])
    assert diversity_order(genres, 2).tolist() == [0, 1, 2, 4, 6, 3, 5]


@pytest.mark.parametrize("known", [True, False])
def test_serving_features_equal_one_full_workflow_transform(release: Release, known: bool) -> None:
    """Item columns cached at load + the user encoded once == the training-time transform."""
    from core.features.rows import AttributeTable, join_rows
    from core.features.schema import MOVIELENS
    from core.features.spec import dense_block

    user = _user(release) if known else None
    ctx = _ctx(release, user=user)
    ctx.candidates = release.popularity[:25]
    sparse, dense = release.features.ranking_inputs(ctx)
    attributes = user.attributes if user else dict.fromkeys(MOVIELENS.user_attributes)
    users = AttributeTable(
        pd.DataFrame([{"user_id": ctx.user_id, **attributes}]), "user_id", MOVIELENS.user_attributes
    )
    n = len(ctx.candidates)
    rows = join_rows(
        users,
        release.items,
        np.full(n, ctx.user_id),
        release.item_ids[ctx.candidates],
        np.full(n, ctx.timestamp),
    )
    full = release.workflow.transform(rows)
    np.testing.assert_array_equal(
        sparse, np.stack([full[c] for c in MOVIELENS.sparse_columns], axis=1)
    )
    np.testing.assert_array_equal(dense, dense_block(full, MOVIELENS))


async def test_scoring_flags_default_embedding_rows(exported: Path, release: Release) -> None:
    backend = await _backend(exported, release, "embeddings_degraded")
    stage = ScoringStage({release.version: release}, backend, _breaker(), 1.0)
    ctx = _ctx(release, user=_user(release))
    ctx.candidates, ctx.retrieval_scores = release.popularity[:40], np.ones(40, np.float32)
    ctx = await stage(ctx)
    assert ctx.reasons == ["scoring:embeddings_unavailable"]
    assert not np.array_equal(ctx.scores, ctx.retrieval_scores)  # model scores still used


def test_a_neighbour_table_that_does_not_fit_the_index_is_refused(
    release: Release, tmp_path: Path
) -> None:
    from core.errors import ArtifactError
    from core.item_neighbors import DIRECTORY, ItemNeighbors
    from services.serving.release import _neighbor_source

    assert release.embeddings is not None
    np.save(tmp_path / "item_embeddings.npy", np.asarray(release.embeddings))
    short = ItemNeighbors(np.zeros((3, 2), np.int32), np.zeros((3, 2), np.float32))
    short.save(tmp_path / DIRECTORY)
    with pytest.raises(ArtifactError, match="neighbour table has 3 rows"):
        _neighbor_source(tmp_path, release.index)
    (tmp_path / DIRECTORY / "similarity.npy").write_bytes(b"not an array")
    with pytest.raises(ArtifactError, match="cannot read the item-neighbour source"):
        _neighbor_source(tmp_path, release.index)


def test_items_whose_available_feature_is_false_are_unavailable() -> None:
    from core.features.schema import Feature, FeatureSchema
    from services.serving.release import unavailable_positions

    schema = FeatureSchema(item=(Feature("available", "bool"),))
    items = pd.DataFrame({"available": [True, False, None, "false", "TRUE", 0, np.nan]})
    assert unavailable_positions(items, schema).tolist() == [1, 3, 5]
    assert unavailable_positions(items, FeatureSchema()).tolist() == []  # no such feature
