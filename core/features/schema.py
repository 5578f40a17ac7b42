"""Which user and item features a data set has, and what the models read of them.

A data set declares its features by kind (its dataset file's ``users.features`` and
``items.features``); everything the models and the serving side read is derived from that
declaration here, in one place: the sparse columns (one embedding table each, in order), the
dense inputs, the multi-hot blocks, and the columns of each tower. The schema is saved with
the fitted workflow, so a release carries the schema it was trained with.

Derivation (each feature adds, in the order declared):

- ``categorical`` / ``bool``: a sparse column ``<name>_idx`` (values rarer than
  ``min_frequency`` share bucket 0); ``target_encode: true`` adds a dense target encoding;
- ``numeric``: a sparse column ``<name>_idx`` (each distinct value a bucket) and a dense
  cross-side mean (a user's mean of an item feature over the items they interacted with, an
  item's mean of a user feature over its users); ``item_age: true`` (an item's year; one
  feature at most) adds the item's age in years at request time;
- ``multi_categorical``: a multi-hot block in the dense input (items: also in the item
  tower) and, for items, a sparse column ``<name>_first_idx`` (the first value listed).

The MovieLens declaration (``MOVIELENS``) derives exactly the feature set the project has
always trained on.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

Kind = Literal["numeric", "categorical", "multi_categorical", "bool"]
KINDS: tuple[str, ...] = ("numeric", "categorical", "multi_categorical", "bool")

HOUR, WEEKDAY = "hour", "weekday"  # from the request (or interaction) time
TIME_CARDINALITY = {HOUR: 24, WEEKDAY: 7}


@dataclass(frozen=True)
class Feature:
    """One declared user or item feature."""

    name: str
    kind: Kind
    min_frequency: int = 1  # categorical: rarer values share the unknown bucket
    target_encode: bool = False  # categorical: add a dense target encoding
    item_age: bool = False  # numeric item feature holding a year: add the item's age
    separator: str | None = None  # multi_categorical given as a delimited string

    @property
    def sparse(self) -> str | None:
        """Its sparse column, if it has one on its side (user multi-hot features do not)."""
        if self.kind == "multi_categorical":
            return None
        return f"{self.name}_idx"

    @property
    def multi_hot(self) -> str | None:
        return f"{self.name}_multi_hot" if self.kind == "multi_categorical" else None


@dataclass(frozen=True)
class FeatureSchema:
    """The user and item features of a data set (module docs)."""

    user: tuple[Feature, ...] = ()
    item: tuple[Feature, ...] = ()

    def __post_init__(self) -> None:
        names = [f.name for f in (*self.user, *self.item)]
        reserved = {"user_id", "item_id", "timestamp", "rating", "label", "weight"}
        clash = sorted({n for n in names if names.count(n) > 1} | (set(names) & reserved))
        if clash:
            raise ValueError(f"feature names must be unique and not {sorted(reserved)}: {clash}")
        aged = [f.name for f in self.item if f.item_age]
        if len(aged) > 1 or any(f.item_age and f.kind != "numeric" for f in self.item):
            raise ValueError(f"item_age: one numeric item feature at most, got {aged}")
        if any(f.item_age for f in self.user):
            raise ValueError("item_age belongs to an item feature")

    # --- what the models read ---------------------------------------------------------
    @property
    def user_attributes(self) -> tuple[str, ...]:
        """Raw user columns (besides ``user_id``) the rows carry."""
        return tuple(f.name for f in self.user)

    @property
    def item_attributes(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.item)

    @property
    def item_multi(self) -> tuple[Feature, ...]:
        return tuple(f for f in self.item if f.kind == "multi_categorical")

    @property
    def user_multi(self) -> tuple[Feature, ...]:
        return tuple(f for f in self.user if f.kind == "multi_categorical")

    @property
    def user_tower_columns(self) -> tuple[str, ...]:
        return ("user_id_idx", *(s for f in self.user if (s := f.sparse)))

    @property
    def item_tower_columns(self) -> tuple[str, ...]:
        singles = tuple(s for f in self.item if (s := f.sparse))
        firsts = tuple(f"{f.name}_first_idx" for f in self.item_multi)
        return ("item_id_idx", *singles, *firsts)

    @property
    def sparse_columns(self) -> tuple[str, ...]:
        """One embedding table each, in table order."""
        return (
            "user_id_idx",
            "item_id_idx",
            *self.user_tower_columns[1:],
            *self.item_tower_columns[1:],
            HOUR,
            WEEKDAY,
        )

    @property
    def item_age(self) -> Feature | None:
        """The item feature holding a year, whose age the ranker reads (at most one)."""
        return next((f for f in self.item if f.item_age), None)

    @property
    def target_encoded(self) -> tuple[Feature, ...]:
        return tuple(f for f in (*self.user, *self.item) if f.target_encode)

    @property
    def dense_inputs(self) -> tuple[str, ...]:
        """The dense columns, standardised together into ``dense``."""
        means = [f"user_mean_item_{f.name}" for f in self.item if f.kind == "numeric"]
        means += [f"item_mean_user_{f.name}" for f in self.user if f.kind == "numeric"]
        ages = ["item_age_years"] if self.item_age else []
        return (
            "user_id_idx_count",
            "item_id_idx_count",
            "user_id_idx_te_label",
            "item_id_idx_te_label",
            *(f"{f.name}_idx_te_label" for f in self.target_encoded),
            *means,
            *ages,
        )

    @property
    def multi_hot_columns(self) -> tuple[str, ...]:
        """The multi-hot blocks appended to the dense input (items first)."""
        return tuple(m for f in (*self.item_multi, *self.user_multi) if (m := f.multi_hot))

    # --- saving -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"user": [asdict(f) for f in self.user], "item": [asdict(f) for f in self.item]}

    @classmethod
    def from_dict(cls, value: dict) -> FeatureSchema:
        return cls(
            user=tuple(Feature(**f) for f in value.get("user", ())),
            item=tuple(Feature(**f) for f in value.get("item", ())),
        )


MOVIELENS = FeatureSchema(
    user=(
        Feature("gender", "categorical"),
        Feature("age", "numeric"),
        Feature("occupation", "categorical", target_encode=True),
        Feature("zip_code", "categorical", min_frequency=2),
    ),
    item=(
        Feature("year", "numeric", item_age=True),
        Feature("genres", "multi_categorical", separator="|"),
    ),
)
