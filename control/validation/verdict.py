"""The gate's verdict: every check with its value, threshold, interval and outcome, written
as ``releases/<version>/validation.json`` and printed as a table.

``validation.json`` is not listed in the version's manifest (it is written after the
export is sealed); the loaders' verification logs unlisted files and never reads them, so
it does not break verification, and nothing serves it.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from core.errors import writing

VALIDATION_FILE = "validation.json"


@dataclass
class Check:
    """One check: ``passed`` when ``value`` is on the right side of ``threshold``."""

    name: str
    value: float | None
    threshold: float | None
    passed: bool
    detail: str = ""
    interval: tuple[float, float] | None = None  # bootstrap interval of the relative difference
    kind: str = "floor"  # floor, ceiling, non_inferiority, slice, sanity
    outcome: str | None = None  # non-inferiority: non_inferior, worse, insufficient_evidence

    def __post_init__(self) -> None:  # numpy scalars in, plain Python out (JSON)
        self.passed = bool(self.passed)
        self.value = None if self.value is None else float(self.value)
        self.threshold = None if self.threshold is None else float(self.threshold)
        if self.interval is not None:
            self.interval = (float(self.interval[0]), float(self.interval[1]))


@dataclass
class Verdict:
    candidate: int
    production: int | None
    checks: list[Check]
    data_hash: str
    holdout_hash: str
    holdout: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    forced: bool = False

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def failed_checks(self) -> list[str]:
        return [c.name for c in self.checks if not c.passed]

    def with_outcome(self, outcome: str) -> list[str]:
        return [c.name for c in self.checks if c.outcome == outcome]

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": "pass" if self.passed else "fail",
            "forced": self.forced,
            "candidate": self.candidate,
            "production": self.production,
            "first_deploy": self.production is None,
            "failed_checks": self.failed_checks,
            "worse": self.with_outcome("worse"),
            "insufficient_evidence": self.with_outcome("insufficient_evidence"),
            "data_hash": self.data_hash,
            "holdout_hash": self.holdout_hash,
            "holdout": self.holdout,
            "notes": self.notes,
            "checks": [_clean(asdict(c)) for c in self.checks],
        }


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: they become null (and "inf" strings for infinities)."""
    if hasattr(value, "item") and not isinstance(value, list | tuple | dict):
        value = value.item()  # numpy scalar
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def write_verdict(release_dir: Path, verdict: Verdict) -> Path:
    """Write ``validation.json`` atomically (temporary file, fsync, rename)."""
    path = release_dir / VALIDATION_FILE
    temporary = release_dir / f".{VALIDATION_FILE}.{os.getpid()}.tmp"
    with writing(path):
        with temporary.open("w") as out:
            json.dump(verdict.as_dict(), out, indent=2, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    return path


def read_verdict(release_dir: Path) -> dict[str, Any] | None:
    path = release_dir / VALIDATION_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _number(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.4g}"


def table(verdict: Verdict) -> str:
    """The verdict as a fixed-width table, one line per check, then the outcome."""
    against = f"production {verdict.production}" if verdict.production else "no production"
    lines = [
        f"validation of version {verdict.candidate} against {against} "
        f"(holdout {verdict.holdout_hash}, data {verdict.data_hash})",
        f"{'check':<36} {'value':>10} {'threshold':>10} {'95% interval':>21}  result  detail",
    ]
    if verdict.holdout:
        size = verdict.holdout
        lines.insert(
            1,
            f"holdout: {size.get('rows', 0):,} rows, {size.get('users', 0):,} users with a new "
            f"positive, {size.get('ranking_rows', 0):,} ranking rows",
        )
    for check in verdict.checks:
        interval = (
            f"[{_number(check.interval[0])}, {_number(check.interval[1])}]"
            if check.interval
            else ""
        )
        lines.append(
            f"{check.name:<36} {_number(check.value):>10} {_number(check.threshold):>10} "
            f"{interval:>21}  {'pass' if check.passed else 'FAIL':<6}  {check.detail}"
        )
    lines.extend(f"note: {note}" for note in verdict.notes)
    outcome = "PASS" if verdict.passed else "FAIL"
    if verdict.forced and not verdict.passed:
        outcome += " (forced: registered as a candidate anyway)"
    failed = f": {', '.join(verdict.failed_checks)}" if verdict.failed_checks else ""
    lines.append(f"verdict: {outcome}{failed}")
    unsure = verdict.with_outcome("insufficient_evidence")
    if unsure:
        lines.append(
            f"  insufficient evidence (the holdout cannot tell, not shown worse): "
            f"{', '.join(unsure)}"
        )
    return "\n".join(lines)
