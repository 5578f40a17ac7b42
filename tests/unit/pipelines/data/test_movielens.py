from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from core.errors import DataError
from pipelines.data.movielens import default_directory, load_movielens_100k


@pytest.fixture
def copy_of_ml100k(tmp_path: Path) -> Path:
    target = tmp_path / "ml-100k"
    target.mkdir()
    for name in ("ml-100k.user", "ml-100k.item", "ml-100k.inter"):
        shutil.copy(default_directory() / name, target / name)
    return target


def _rewrite_line(path: Path, number: int, text: str) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[number - 1] = text
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_loads_the_shipped_files() -> None:
    data = load_movielens_100k()
    assert (len(data.users), len(data.items), len(data.interactions)) == (943, 1682, 100_000)
    assert set(np.unique(data.interactions["rating"])) == {1.0, 2.0, 3.0, 4.0, 5.0}
    assert data.items.loc[data.items.item_id == 1, "genres"].item() == "Animation|Children's|Comedy"
    # the one row whose year sits in its title is recovered; the "unknown" movie has none
    assert data.items.loc[data.items.item_id == 1412, "year"].item() == 1995
    assert np.isnan(data.items.loc[data.items.item_id == 267, "year"].item())


def test_missing_file_is_named(copy_of_ml100k: Path) -> None:
    (copy_of_ml100k / "ml-100k.item").unlink()
    with pytest.raises(DataError, match=r"ml-100k\.item: file is missing"):
        load_movielens_100k(copy_of_ml100k)


def test_bad_header_names_line_1(copy_of_ml100k: Path) -> None:
    _rewrite_line(copy_of_ml100k / "ml-100k.user", 1, "user_id\tage")
    with pytest.raises(DataError, match=r"ml-100k\.user:1: header"):
        load_movielens_100k(copy_of_ml100k)


def test_wrong_field_count_names_the_line(copy_of_ml100k: Path) -> None:
    _rewrite_line(copy_of_ml100k / "ml-100k.inter", 7, "1\t2\t3")
    with pytest.raises(
        DataError, match=r"ml-100k\.inter:7: expected 4 tab-separated fields, found 3"
    ):
        load_movielens_100k(copy_of_ml100k)


def test_non_numeric_rating_names_the_line(copy_of_ml100k: Path) -> None:
    _rewrite_line(copy_of_ml100k / "ml-100k.inter", 12, "1\t2\tfive\t881250949")
    with pytest.raises(DataError, match=r"ml-100k\.inter:12: rating 'five' is not a valid float"):
        load_movielens_100k(copy_of_ml100k)


def test_rating_out_of_range_names_the_line(copy_of_ml100k: Path) -> None:
    _rewrite_line(copy_of_ml100k / "ml-100k.inter", 3, "1\t2\t9\t881250949")
    with pytest.raises(DataError, match=r"ml-100k\.inter:3: rating '9' is outside 1\.\.5"):
        load_movielens_100k(copy_of_ml100k)


def test_bad_year_names_the_line(copy_of_ml100k: Path) -> None:
    _rewrite_line(copy_of_ml100k / "ml-100k.item", 5, "4\tGet Shorty\tnineteen\tComedy")
    with pytest.raises(DataError, match=r"ml-100k\.item:5: release_year 'nineteen' is not a year"):
        load_movielens_100k(copy_of_ml100k)


def test_interaction_with_unknown_user_is_rejected(copy_of_ml100k: Path) -> None:
    _rewrite_line(copy_of_ml100k / "ml-100k.inter", 2, "99999\t2\t3\t881250949")
    with pytest.raises(DataError, match=r"ml-100k\.inter:2: user_id 99999 is not in ml-100k\.user"):
        load_movielens_100k(copy_of_ml100k)
