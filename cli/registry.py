"""``cascade versions`` and ``cascade gc``: the registry and retention on the command line.

Both read the settings (``CASCADE_*``; ``--artifacts`` overrides the export root): the
registry is Redis's when ``CASCADE_REDIS__URL`` is set, else ``<artifacts>/registry.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from cli.options import add_artifacts, non_negative_int
from control.registry import Registry, VersionRecord, make_registry
from control.retention import collect_garbage, disk_versions, plan_garbage
from core.export.verify import MANIFEST

# (column, section, model, metric) of releases/<v>/manifest.json "metrics"
METRICS = (
    ("recall@10", "retrieval", "two_tower", "recall@10"),
    ("ndcg@10", "retrieval", "two_tower", "ndcg@10"),
    ("auc", "ranking", "blend", "auc"),
)


def _open(args: argparse.Namespace) -> tuple[Any, Registry]:
    from services.settings import Settings

    settings = Settings(**({"artifacts": args.artifacts} if args.artifacts is not None else {}))
    return settings, make_registry(settings)


def versions_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "versions",
        help="list exported versions: state, test metrics, validation verdict",
        description="Every version the registry knows or the export root holds, oldest first: "
        "state (candidate, rejected, canary, production, retired; 'unregistered' = on disk "
        "only), creation time, test metrics from its manifest, verdict and failed checks.",
    )
    add_artifacts(parser)
    parser.add_argument("--json", action="store_true", help="one JSON array instead of a table")


def _manifest(artifacts: Path, version: int) -> dict[str, Any] | None:
    try:
        data = json.loads((artifacts / "releases" / str(version) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _metrics(manifest: dict[str, Any] | None) -> dict[str, float | None]:
    metrics = (manifest or {}).get("metrics") or {}
    out: dict[str, float | None] = {}
    for column, section, model, metric in METRICS:
        value = metrics.get(section, {}).get(model, {}).get(metric)
        out[column] = float(value) if isinstance(value, int | float) else None
    return out


# Each version's figures come from its own test set, so they compare within a kind only.
METRICS_NOTE = (
    "metrics: each version's own test set (cascade train: a random tenth of its data; "
    "cascade retrain: the newest holdout, harder); compare versions with the gate "
    "(releases/<v>/validation.json), not across these columns"
)


def version_rows(registry: Registry, artifacts: Path) -> list[dict[str, Any]]:
    """One dict per version (registered or on disk), oldest first."""
    records: dict[int, VersionRecord] = {r.version: r for r in registry.records()}
    previous = registry.previous_production()
    rows = []
    for version in sorted(set(records) | disk_versions(artifacts)):
        record, manifest = records.get(version), _manifest(artifacts, version)
        rows.append(
            {
                "version": version,
                "state": record.state.value if record else "unregistered",
                "previous_production": version == previous,
                "complete_on_disk": manifest is not None,
                "created_at": record.created_at if record else None,
                "exported_at": (manifest or {}).get("created_at"),
                "updated_at": record.updated_at if record else None,
                "metrics": _metrics(manifest),
                "verdict": record.verdict if record else None,
                "history": record.history if record else [],
            }
        )
    return rows


def _cell(row: dict[str, Any], column: str) -> str:
    verdict = row["verdict"] or {}
    if column == "version":
        return str(row["version"])
    if column == "state":
        adopted = row["state"] == "production" and any(
            str(h.get("reason", "")).startswith("adopted") for h in row["history"]
        )  # production by first deploy, not through a gate and a rollout
        notes = [
            " (adopted)" if adopted else "",
            " (previous)" if row["previous_production"] else "",
        ]
        notes.append("" if row["complete_on_disk"] else " (no files)")
        return row["state"] + "".join(notes)
    if column == "created":
        if row["created_at"] is not None:
            return time.strftime("%Y-%m-%d %H:%M", time.localtime(row["created_at"]))
        return str(row["exported_at"] or "-")[:16].replace("T", " ")
    if column == "verdict":
        return (verdict.get("verdict") or "-") + (" (forced)" if verdict.get("forced") else "")
    if column == "failed checks":
        return ", ".join(map(str, verdict.get("failed_checks") or [])) or "-"
    value = row["metrics"].get(column)
    return "-" if value is None else f"{value:.4f}"


def run_versions(args: argparse.Namespace) -> int:
    settings, registry = _open(args)
    try:
        rows = version_rows(registry, settings.artifacts)
    finally:
        registry.close()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no versions under {settings.artifacts} and none registered")
        return 0
    columns = ["version", "state", "created", *(m[0] for m in METRICS), "verdict"]
    columns.append("failed checks")
    table = [[_cell(row, c) for c in columns] for row in rows]
    widths = [max(len(c), *(len(line[i]) for line in table)) for i, c in enumerate(columns)]
    for line in [[c.upper() for c in columns], *table]:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )
    print(METRICS_NOTE)
    return 0


def gc_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "gc",
        help="remove old versions: artifacts, Redis embedding rows, registry records",
        description="Keep the production version, the previous production, the canary, "
        "versions not registered yet, the newest version and the --keep newest others; "
        "remove every older version's directories, embedding rows and record.",
    )
    add_artifacts(parser)
    parser.add_argument(
        "--keep",
        type=non_negative_int,
        default=3,
        help="newest non-serving versions kept (default: 3)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print what would be removed; remove nothing"
    )


def _listing(versions: list[int]) -> str:
    return ", ".join(map(str, versions)) or "-"


def run_gc(args: argparse.Namespace) -> int:
    settings, registry = _open(args)
    protect = [v for v in (settings.model_version, settings.canary_version) if v is not None]
    rows_url = settings.embedding_cache.redis_url or settings.redis.url
    try:
        plan = plan_garbage(registry, settings.artifacts, args.keep, protect)
        print(
            f"kept: serving {_listing(plan.serving)}; newest {args.keep} others "
            f"{_listing(plan.kept)}; not yet registered {_listing(plan.unregistered)}"
        )
        removed = collect_garbage(
            registry,
            settings.artifacts,
            args.keep,
            rows_url,
            settings.embedding_cache.namespace,
            dry_run=args.dry_run,
            protect=protect,
        )
    finally:
        registry.close()
    verb = "would remove" if args.dry_run else "removed"
    if not removed:
        print("nothing to remove")
    for version in removed:
        rows = " and its Redis embedding rows" if rows_url else ""
        print(f"{verb} version {version}: directories{rows}, registry record")
    return 0
