"""The dataset file: the YAML contract, its one-line errors, paths and the feature schema."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ConfigError, DataError
from core.features.schema import Feature
from pipelines.data.dataset_file import load_dataset_file

BASE = """\
interactions:
  path: events/*.parquet
  user: customer_id
  item: sku
  timestamp: ts
  event: {column: action, positive: [purchase, click], weight: {purchase: 3.0}}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "dataset.yaml"
    path.write_text(text)
    return path


def test_the_documented_file_parses_with_paths_relative_to_it(tmp_path: Path) -> None:
    text = BASE + (
        "users:\n  path: users.csv\n  key: customer_id\n"
        "  features: {age: numeric, country: categorical, segments: multi_categorical}\n"
        "items:\n  path: /abs/items.parquet\n  key: sku\n"
        "  features:\n    brand: {kind: categorical, min_frequency: 2, target_encode: true}\n"
        "    year: {kind: numeric, item_age: true}\n"
        '    tags: {kind: multi_categorical, separator: "|"}\n    available: bool\n'
    )
    dataset = load_dataset_file(write(tmp_path, text))
    assert dataset.name == "dataset"
    assert dataset.resolve(dataset.spec.interactions.path) == tmp_path / "events/*.parquet"
    assert dataset.resolve("/abs/items.parquet") == Path("/abs/items.parquet")
    schema = dataset.feature_schema()
    assert schema.user_attributes == ("age", "country", "segments")
    assert schema.item == (
        Feature("brand", "categorical", min_frequency=2, target_encode=True),
        Feature("year", "numeric", item_age=True),
        Feature("tags", "multi_categorical", separator="|"),
        Feature("available", "bool"),
    )
    assert dataset.spec.interactions.columns == ["customer_id", "sku", "ts", "action"]


def test_name_rating_rule_and_csv_options(tmp_path: Path) -> None:
    text = (
        "name: shop\ninteractions:\n  path: r.csv\n  delimiter: ';'\n  user: u\n  item: i\n"
        "  timestamp: t\n  timestamp_format: ms\n"
        "  rating: {column: stars, positive_at: 4, neutral_at: 3}\n"
    )
    dataset = load_dataset_file(write(tmp_path, text))
    assert dataset.name == "shop"
    assert dataset.spec.interactions.delimiter == ";"
    rating = dataset.spec.interactions.rating
    assert rating is not None and (rating.positive_at, rating.neutral_at) == (4, 3)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            BASE.replace("positive: [purchase, click], weight: {purchase: 3.0}", "positive: []"),
            "dataset.yaml: interactions.event.positive: must list at least one value",
        ),
        (BASE.replace("  user: customer_id\n", ""), "interactions.user: missing"),
        (BASE + "  colour: red\n", "interactions.colour: unknown key"),
        (
            BASE.replace("weight: {purchase: 3.0}", "weight: {view: 2.0}"),
            "interactions.event: weight: ['view'] are not listed in positive",
        ),
        (
            BASE.replace("weight: {purchase: 3.0}", "weight: {purchase: 0}"),
            "interactions.event.weight: weights must be > 0",
        ),
        (
            BASE + "  rating: {column: stars, positive_at: 4}\n",
            "interactions: give exactly one of `event:` and `rating:`",
        ),
        (
            BASE.replace(
                "event: {column: action, positive: [purchase, click], weight: {purchase: 3.0}}",
                "rating: {column: stars, positive_at: 4, neutral_at: 4}",
            ),
            "interactions.rating: neutral_at (4) must be below positive_at (4)",
        ),
        (BASE + "  timestamp_format: weeks\n", "interactions.timestamp_format: must be one of"),
        (
            BASE + "items: {path: i.csv, key: sku, features: {brand: colour}}\n",
            "items.features.brand.kind: input should be",
        ),
        (
            BASE + "items: {path: i.csv, key: sku, features: {rating: numeric}}\n",
            "features: feature names must be unique and not",
        ),
        (
            BASE + "items: {path: i.csv, key: sku, features: {b: {kind: categorical, "
            "item_age: true}}}\n",
            "item_age: one numeric item feature at most",
        ),
        ("- just a list\n", "expected a mapping with an `interactions:` key"),
    ],
)
def test_mistakes_are_one_line_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_dataset_file(write(tmp_path, text))
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_unreadable_yaml_names_the_line(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"dataset.yaml:2: not valid YAML: mapping values"):
        load_dataset_file(write(tmp_path, "interactions:\n  path: a: b\n"))


def test_a_missing_dataset_file_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cannot read the dataset file"):
        load_dataset_file(tmp_path / "absent.yaml")
