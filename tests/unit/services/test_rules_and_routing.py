from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ConfigError
from services.serving.routing import VersionRouter
from services.serving.rules import load_rules


def test_rules_load_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(
        "exclude:\n  - genres: [Horror]\n    max_user_age: 17\n"
        "boosts:\n  - genres: [Comedy]\n    factor: 1.5\n"
        "    start: 2026-01-01\n    end: 2026-01-31\n"
        "diversity: {max_per_genre: 2}\npinned:\n  - {item_id: 4, position: 0}\n"
    )
    rules = load_rules(path)
    assert rules.diversity.max_per_genre == 2 and rules.pinned[0].item_id == 4
    assert rules.exploration.epsilon == 0.0  # off by default


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("boosts:\n  - factor: 2\n", "a boost needs item_ids or genres"),
        (
            "boosts:\n  - {genres: [A], start: 2026-02-01, end: 2026-01-01}\n",
            "start is after its end",
        ),
        ("diversity: {max_per_genre: 0}\n", "max_per_genre"),
        ("pinned:\n  - {item_id: 1, position: -1}\n", "position"),
        ("surprise: 1\n", "surprise"),
        ("boosts: [\n", "not valid YAML"),
    ],
)
def test_bad_rules_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_rules(path)


def test_missing_rules_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_rules(tmp_path / "nope.yaml")


def test_router_splits_users_stably_and_honours_explicit_versions() -> None:
    router = VersionRouter(default=3, canary=4, canary_percent=25)
    routed = [router.route(u) for u in range(4000)]
    share = routed.count(4) / len(routed)
    assert 0.2 < share < 0.3
    assert routed == [router.route(u) for u in range(4000)]  # stable per user
    assert router.route(1, requested=3) == 3 and router.route(1, requested=99) in (3, 4)
    assert VersionRouter(default=3).route(7) == 3


def test_the_router_names_the_split_that_assigned_each_user() -> None:
    router = VersionRouter(default=3, canary=4, canary_percent=5.000000000000001, salt="s")
    assigned = {router.assign(u) for u in range(2000)}
    assert assigned == {(3, "4:0.05"), (4, "4:0.05")}  # both arms, one share
    assert router.assign(1, requested=4) == (4, "")  # the client chose: not the split's
    assert router.assign(1, requested=99)[1] == "4:0.05"  # not served: the split decides
    assert VersionRouter(default=3).assign(7) == (3, "")
    assert VersionRouter(default=3, canary=4, canary_percent=0).assign(7) == (3, "")


def test_each_salt_draws_its_own_canary_users_and_a_higher_weight_keeps_them() -> None:
    users = range(20_000)
    first = {u for u in users if VersionRouter(3, 4, 10, salt="a1").route(u) == 4}
    second = {u for u in users if VersionRouter(3, 4, 10, salt="b2").route(u) == 4}
    wider = {u for u in users if VersionRouter(3, 4, 30, salt="a1").route(u) == 4}
    assert 1_700 < len(first) < 2_300 and 1_700 < len(second) < 2_300
    # independent draws overlap in about 10 % of 10 %, not in all of them
    assert len(first & second) < 0.2 * len(first)
    assert first <= wider and 5_500 < len(wider) < 6_500
