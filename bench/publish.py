"""Where a benchmark's result goes: ``bench/results/<name>.json`` (indented, everything) and,
as the run's last line, one JSON object on one line (what the notes quote)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def publish(name: str, record: dict[str, Any], line: dict[str, Any] | None = None) -> None:
    """Write ``record`` to ``bench/results/<name>.json`` and print ``line`` (default: the
    record itself) as the last line of output."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=2, sort_keys=True))
    print(json.dumps(record if line is None else line, sort_keys=True), flush=True)
