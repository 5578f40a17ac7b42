"""``cascade catalog update ITEMS_FILE``: new or changed items into a new version, without
retraining (``pipelines/export/catalog.py``), registered like any new version so that it
goes live the way every version does (``cascade rollout``, ``cascade promote``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from cli import options as opt


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "catalog",
        help="update the served item catalog (new SKUs, attributes) without retraining",
        description="Catalog commands. `update ITEMS_FILE`: merge an item table (parquet, CSV "
        "or JSON lines, with the release's item key and item features) into a version, embed "
        "the new and changed items with its exported item tower, and write the result as a "
        "new version (its models copied), registered with its base version's verdict. It "
        "goes live like any version: `cascade rollout VERSION`, or `cascade rollout VERSION "
        "--once` then `cascade promote` (docs/catalog.md). Nothing is written when the table "
        "fails its checks.",
    )
    actions = parser.add_subparsers(dest="action", required=True)
    update = actions.add_parser(
        "update",
        help="merge ITEMS_FILE into a version and write it as a new version",
        formatter_class=opt.HelpWithDefaults,
    )
    update.add_argument("items_file", type=Path, metavar="ITEMS_FILE", help="the item table")
    opt.add_artifacts(update)
    update.add_argument(
        "--version",
        dest="base",
        type=opt.positive_int,
        default=None,
        help="the version to update (default: the registry's production, else the newest)",
    )
    update.add_argument(
        "--key",
        default=None,
        help="the item key column (default: the one the version records, else item_id)",
    )
    update.add_argument("--json", action="store_true", help="print the outcome as JSON")


def run(args: argparse.Namespace) -> int:
    from control.registry import adopt_served, make_registry
    from core.errors import UsageError
    from pipelines.export.catalog import update_catalog
    from services.state.desired_state import pin_production

    if not args.items_file.is_file():
        raise UsageError(f"ITEMS_FILE {args.items_file}: no such file")
    settings = opt.settings(args)
    registry = make_registry(settings)
    try:
        production = adopt_served(registry, settings.artifacts)  # what serves now stays so
        base = args.base if args.base is not None else production
        outcome = update_catalog(settings.artifacts, args.items_file, base, args.key)
        record = registry.get(outcome.base)
        inherited = dict((record.verdict if record else None) or {"verdict": "pass"})
        inherited["catalog_update"] = {
            "base": outcome.base,
            "added": outcome.added,
            "changed": outcome.changed,
        }
        registered = registry.register(outcome.version, inherited)
        pin_production(settings, registry.production())
    finally:
        registry.close()
    summary = {
        "version": outcome.version,
        "base": outcome.base,
        "added": outcome.added,
        "changed": outcome.changed,
        "unchanged": outcome.unchanged,
        "items": outcome.items,
        "state": registered.state.value,
    }
    if args.json:
        print(json.dumps(summary), flush=True)
        return 0
    print(
        f"version {outcome.version} written from version {outcome.base}: {outcome.added} "
        f"added, {outcome.changed} changed, {outcome.unchanged} unchanged "
        f"({outcome.items} items); registered {registered.state.value}",
        flush=True,
    )
    print(
        f"make it live: cascade rollout {outcome.version} (canary, then promotion), or "
        f"cascade rollout {outcome.version} --once && cascade promote",
        flush=True,
    )
    return 0
