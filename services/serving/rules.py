"""Business rules for ordering (and rule-based exclusions), loaded from a YAML file.

```yaml
exclude:
  - item_ids: [13, 99]                 # never recommend
  - genres: [Horror]                   # not for users aged 17 or younger
    max_user_age: 17
boosts:
  - genres: [Comedy]                   # campaign: x1.2 inside the date range
    factor: 1.2
    start: 2026-12-01
    end: 2026-12-31
  - item_ids: [50]
    add: 0.05
diversity:
  max_per_genre: 3                     # of the first k, at most 3 per primary genre
pinned:
  - item_id: 1
    position: 0
exploration:
  epsilon: 0.0                         # off by default
```

Items are named by the data set's own ids (integers, or strings such as ``sku-13``), as in
the API. Each release maps them to its internal ids when it loads (``Rules.for_items``); ids
it does not know are dropped, logged once with their count.
"""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from core.errors import ConfigError
from core.ids import UNKNOWN, ExternalId, IdMap
from services.serving.ids import Id

log = logging.getLogger(__name__)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Exclusion(_Strict):
    item_ids: list[Id] = []
    genres: list[str] = []
    max_user_age: int | None = Field(None, description="Applies only to users this age or younger.")


class Boost(_Strict):
    item_ids: list[Id] = []
    genres: list[str] = []
    factor: float = Field(1.0, gt=0)
    add: float = 0.0
    start: dt.date | None = None
    end: dt.date | None = None

    @model_validator(mode="after")
    def _targets_something(self) -> Boost:
        if not self.item_ids and not self.genres:
            raise ValueError("a boost needs item_ids or genres")
        if self.start and self.end and self.start > self.end:
            raise ValueError("boost start is after its end")
        return self

    def active(self, when: dt.date) -> bool:
        return (self.start is None or self.start <= when) and (self.end is None or when <= self.end)


class Diversity(_Strict):
    max_per_genre: int | None = Field(None, ge=1)


class Pin(_Strict):
    item_id: Id
    position: int = Field(ge=0)


class Exploration(_Strict):
    epsilon: float = Field(0.0, ge=0.0, le=1.0)


class Rules(_Strict):
    exclude: list[Exclusion] = []
    boosts: list[Boost] = []
    diversity: Diversity = Diversity()
    pinned: list[Pin] = []
    exploration: Exploration = Exploration()

    def for_items(self, items: IdMap, release: str) -> Rules:
        """These rules with a release's internal item ids (``items``: its item map) in place
        of the data set's ids; ids the release does not know are dropped (one log line with
        their count, naming ``release``)."""
        named = [
            *(i for rule in self.exclude for i in rule.item_ids),
            *(i for boost in self.boosts for i in boost.item_ids),
            *(pin.item_id for pin in self.pinned),
        ]
        if not named:
            return self
        internal = dict(zip(named, items.to_internal(named).tolist(), strict=True))
        unknown = {i for i, known in internal.items() if known == UNKNOWN}
        if unknown:
            log.warning("rules: %d item ids unknown to %s are ignored", len(unknown), release)

        def mapped(ids: list[ExternalId]) -> list[ExternalId]:
            return [internal[i] for i in ids if internal[i] != UNKNOWN]

        return self.model_copy(
            update={
                "exclude": [
                    e.model_copy(update={"item_ids": mapped(e.item_ids)}) for e in self.exclude
                ],
                "boosts": [
                    b.model_copy(update={"item_ids": mapped(b.item_ids)}) for b in self.boosts
                ],
                "pinned": [
                    p.model_copy(update={"item_id": internal[p.item_id]})
                    for p in self.pinned
                    if internal[p.item_id] != UNKNOWN
                ],
            }
        )


def load_rules(path: Path | None) -> Rules:
    """Rules from YAML; no file means no rules. Errors name the file and the field."""
    if path is None:
        return Rules()
    if not path.is_file():
        raise ConfigError(f"rules file {path} does not exist")
    try:
        return Rules.model_validate(yaml.safe_load(path.read_text()) or {})
    except yaml.YAMLError as error:
        raise ConfigError(f"rules file {path} is not valid YAML: {error}") from None
    except ValidationError as error:
        raise ConfigError(f"rules file {path}: {error}") from None
