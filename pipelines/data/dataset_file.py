"""The dataset file: a short YAML file pointing Cascade at a team's own event logs.

It names the interaction files and their columns, the rule that makes a positive (an event
column with positive values, or a rating column with a threshold), and optional user and item
tables with their declared features (``core/features/schema.py``). Paths are relative to the
dataset file. Every mistake is one line naming the file and the key::

    dataset.yaml: interactions.event.positive: must list at least one value

The data itself is checked and converted by ``pipelines/data/ingest.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from core.errors import ConfigError, DataError
from core.features.schema import Feature, FeatureSchema, Kind

# Units a numeric timestamp column may be declared in; anything else with a "%" is a
# strptime pattern for a string column.
TIMESTAMP_UNITS = ("s", "ms", "us", "ns", "iso8601")

EventValue = str | int | bool


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EventRule(_Strict):
    """Positives are the rows whose ``column`` holds one of ``positive``; the others are
    negatives. ``weight`` gives some positive events a training weight other than 1;
    ``retrieval_only`` events count as positives for retrieval only (not for ranking)."""

    column: str
    positive: list[EventValue]
    weight: dict[EventValue, float] = Field(default_factory=dict)
    retrieval_only: list[EventValue] = Field(default_factory=list)

    @field_validator("positive")
    @classmethod
    def _some_positive(cls, value: list[EventValue]) -> list[EventValue]:
        if not value:
            raise ValueError("must list at least one value")
        return value

    @field_validator("weight")
    @classmethod
    def _positive_weights(cls, value: dict[EventValue, float]) -> dict[EventValue, float]:
        bad = [k for k, w in value.items() if not w > 0]
        if bad:
            raise ValueError(f"weights must be > 0, got {bad}")
        return value

    @model_validator(mode="after")
    def _weights_of_positives(self) -> EventRule:
        # YAML reads `purchase` and numbers alike; compare as text so 1 and "1" agree
        positives = {str(v) for v in self.positive}
        stray = [k for k in self.weight if str(k) not in positives]
        if stray:
            raise ValueError(f"weight: {stray} are not listed in positive")
        both = [v for v in self.retrieval_only if str(v) in positives]
        if both:
            raise ValueError(f"retrieval_only: {both} are also listed in positive")
        return self


class RatingRule(_Strict):
    """Ratings ``>= positive_at`` are positives; ``neutral_at <= r < positive_at`` are
    retrieval-only positives; lower ratings are negatives."""

    column: str
    positive_at: float
    neutral_at: float | None = None

    @model_validator(mode="after")
    def _ordered(self) -> RatingRule:
        if self.neutral_at is not None and not self.neutral_at < self.positive_at:
            raise ValueError(
                f"neutral_at ({self.neutral_at:g}) must be below positive_at ({self.positive_at:g})"
            )
        return self


class FeatureSpec(_Strict):
    """One declared feature: a kind, or a mapping of the kind and its options."""

    kind: Kind
    min_frequency: int = Field(1, ge=1)
    target_encode: bool = False
    item_age: bool = False
    separator: str | None = Field(None, min_length=1)


class _Files(_Strict):
    path: str
    delimiter: str = Field(",", min_length=1, max_length=1)  # CSV files only


class InteractionsSpec(_Files):
    """The event logs: which columns hold the user, the item, the time and the outcome."""

    user: str
    item: str
    timestamp: str
    timestamp_format: str | None = None  # s | ms | us | ns | iso8601 | a strptime pattern
    event: EventRule | None = None
    rating: RatingRule | None = None

    @field_validator("timestamp_format")
    @classmethod
    def _known_format(cls, value: str | None) -> str | None:
        if value is not None and value not in TIMESTAMP_UNITS and "%" not in value:
            raise ValueError(f"must be one of {list(TIMESTAMP_UNITS)} or a strptime pattern")
        return value

    @model_validator(mode="after")
    def _one_rule(self) -> InteractionsSpec:
        if (self.event is None) == (self.rating is None):
            raise ValueError("give exactly one of `event:` and `rating:` (what makes a positive)")
        return self

    @property
    def rule_column(self) -> str:
        rule = self.event or self.rating
        assert rule is not None
        return rule.column

    @property
    def columns(self) -> list[str]:
        """The columns read, in order (the rule's column may be the timestamp's, never)."""
        return list(dict.fromkeys([self.user, self.item, self.timestamp, self.rule_column]))


class TableSpec(_Files):
    """A user or item table: its key column and the features it declares."""

    key: str
    features: dict[str, FeatureSpec] = Field(default_factory=dict)

    @field_validator("features", mode="before")
    @classmethod
    def _kind_shorthand(cls, value: Any) -> Any:
        # `age: numeric` is short for `age: {kind: numeric}`
        if isinstance(value, dict):
            return {k: {"kind": v} if isinstance(v, str) else v for k, v in value.items()}
        return value

    @property
    def columns(self) -> list[str]:
        return list(dict.fromkeys([self.key, *self.features]))


class DatasetSpec(_Strict):
    """The whole dataset file (module docs)."""

    name: str | None = None
    interactions: InteractionsSpec
    users: TableSpec | None = None
    items: TableSpec | None = None


class DatasetFile:
    """A parsed dataset file and the directory its paths are relative to."""

    def __init__(self, path: Path, spec: DatasetSpec) -> None:
        self.path = path
        self.spec = spec

    @property
    def name(self) -> str:
        """The data set's name: ``name:``, else the dataset file's stem."""
        return self.spec.name or self.path.stem

    def resolve(self, path: str) -> Path:
        """A path of the file, relative to the dataset file's directory unless absolute."""
        resolved = Path(path).expanduser()
        return resolved if resolved.is_absolute() else self.path.parent / resolved

    def feature_schema(self) -> FeatureSchema:
        """The declared user and item features (separators as declared for the input)."""
        sides = []
        for table in (self.spec.users, self.spec.items):
            features = table.features if table else {}
            sides.append(tuple(Feature(name, **f.model_dump()) for name, f in features.items()))
        try:
            return FeatureSchema(user=sides[0], item=sides[1])
        except ValueError as error:
            raise ConfigError(f"{self.path}: features: {error}") from None


def _where(location: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in location) or "(top level)"


def _reason(error: Any) -> str:
    kind, message = error["type"], error["msg"]
    if kind == "missing":
        return "missing"
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "value_error":
        return message.removeprefix("Value error, ")
    return message[:1].lower() + message[1:]


def parse_dataset(value: Any, path: Path) -> DatasetFile:
    """A dataset file from its parsed YAML ``value``; ConfigError naming ``path`` and the key."""
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: expected a mapping with an `interactions:` key")
    try:
        spec = DatasetSpec.model_validate(value)
    except ValidationError as error:
        first = error.errors()[0]
        raise ConfigError(f"{path}: {_where(first['loc'])}: {_reason(first)}") from None
    dataset = DatasetFile(path, spec)
    dataset.feature_schema()  # feature names and options are checked now, not at the end
    return dataset


def load_dataset_file(path: Path | str) -> DatasetFile:
    """Read and check the dataset file at ``path``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise DataError(path, f"cannot read the dataset file ({error.strerror})") from None
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(error, "problem", None) or str(error)
        raise DataError(path, f"not valid YAML: {problem}", line=line) from None
    return parse_dataset(value, path)
