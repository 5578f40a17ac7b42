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
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from core.errors import ConfigError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Exclusion(_Strict):
    item_ids: list[int] = []
    genres: list[str] = []
    max_user_age: int | None = Field(None, description="Applies only to users this age or younger.")


class Boost(_Strict):
    item_ids: list[int] = []
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
    item_id: int
    position: int = Field(ge=0)


class Exploration(_Strict):
    epsilon: float = Field(0.0, ge=0.0, le=1.0)


class Rules(_Strict):
    exclude: list[Exclusion] = []
    boosts: list[Boost] = []
    diversity: Diversity = Diversity()
    pinned: list[Pin] = []
    exploration: Exploration = Exploration()


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
