"""``cascade materialize``: a release's users, histories, seen sets and embedding rows into the
online store (Redis)."""

from __future__ import annotations

import argparse
from typing import Any

from cli import options as opt
from core.errors import CascadeError, UsageError
from core.redact import redact_url


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "materialize",
        help="load a release's users, histories and seen sets into the online store",
        description="Write every user of a release (attributes, recent history, seen items) and "
        "its embedding rows into the Redis at CASCADE_REDIS__URL (or --redis-url; a "
        "redis+cluster:// URL is a Redis Cluster), pipelined and versioned.",
    )
    opt.add_artifacts(parser)
    parser.add_argument(
        "--version", type=opt.positive_int, default=None, help="release version (default: latest)"
    )
    parser.add_argument(
        "--redis-url",
        default=None,
        help="redis://host:port/db or redis+cluster://host:port of the features and embedding "
        "rows (default: CASCADE_REDIS__URL)",
    )
    parser.add_argument(
        "--candidate",
        action="store_true",
        help="the newest candidate the gate passed instead of --version; none: exit 0 "
        "(a worker that runs on a schedule)",
    )


def defaults(argv: list[str]) -> argparse.Namespace:
    """This command's arguments as its own parser reads ``argv``: every option it
    has gets its default (``serve --materialize`` runs it without spelling them out)."""
    parser = argparse.ArgumentParser(prog="cascade")
    add_parser(parser.add_subparsers())
    return parser.parse_args(["materialize", *argv])


def run(args: argparse.Namespace) -> int:
    import asyncio

    from core.export.repository import latest_version
    from services.stores.materialize import materialize
    from services.stores.redis import RedisStore
    from services.util.redis_client import is_cluster

    settings = opt.settings(args)
    url = args.redis_url or settings.redis.url
    if not url:
        raise CascadeError("no Redis to materialize into: set CASCADE_REDIS__URL or --redis-url")
    if args.candidate and args.version is not None:
        raise UsageError("--candidate and --version exclude each other")
    durable = settings.redis.durable_url or url  # the registry's, and the store's streams'
    if is_cluster(durable):
        raise UsageError(
            "--redis-url is a Redis Cluster: set CASCADE_REDIS__DURABLE_URL to the durable Redis"
        )
    if args.candidate:
        from control.registry import RedisRegistry

        registry = RedisRegistry(durable, settings.redis.namespace)
        try:
            args.version = registry.newest_candidate()
        finally:
            registry.close()
        if args.version is None:
            print("materialize: no candidate (nothing to do)")
            return 0
    version = args.version or latest_version(settings.artifacts)
    if version is None:
        raise CascadeError(f"no release under {settings.artifacts}: run `cascade train` first")

    async def run() -> int:
        store = RedisStore(url, settings.redis.namespace, durable)
        await store.start()
        try:
            return await materialize(store, settings.artifacts / "releases" / str(version))
        finally:
            await store.close()

    from redis.exceptions import RedisError

    from services.embedding_cache.backing import RedisRows
    from services.stores.materialize import materialize_embeddings

    cache = settings.embedding_cache
    try:
        count = asyncio.run(run())
        print(f"materialized {count} users of release {version} into {redact_url(url)}")
        rows = RedisRows(cache.redis_url or url, cache.namespace, timeout_s=30.0)
        try:
            written = materialize_embeddings(rows, settings.artifacts / "model_repository", version)
        finally:
            rows.close()
    except (RedisError, OSError) as error:
        raise CascadeError(
            f"materialize into {redact_url(cache.redis_url or url)} failed: {error}"
        ) from None
    print(f"materialized {written} embedding rows of model version {version}")
    return 0
