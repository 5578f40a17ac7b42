"""``cascade recommend``: every listed user's answer, offline, with the gateway's own stages,
rules and release (``services/serving/batch.py``), streamed into a parquet file: one row per
(user, rank) with the item, its score and the version that answered."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from cli import options as opt
from core.errors import DataError, UsageError

PROGRESS_EVERY_S = 10.0


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "recommend",
        help="answer a list of users offline (campaigns), as the gateway would",
        description="Read user ids from a file (parquet, CSV or JSON lines; a file, a "
        "directory or a glob), compute each user's top --k with the same release, stages, "
        "rules and version routing as the gateway (a gateway is started in this process, on "
        "CASCADE_* settings), and write one parquet row per (user, rank): user_id, rank, "
        "item_id, score, model_version, degraded. Users the release does not know get the "
        "cold-start answer. Answers are not logged as impressions.",
    )
    parser.add_argument(
        "--users", type=Path, required=True, help="the file(s) of user ids (required)"
    )
    parser.add_argument("--user-column", default="user_id", help="the column holding the user ids")
    parser.add_argument(
        "--k", type=opt.number(int, ge=1, le=500), default=100, help="items per user"
    )
    parser.add_argument(
        "--output", type=Path, required=True, help="the parquet file to write (required)"
    )
    opt.add_artifacts(parser)
    parser.add_argument(
        "--version",
        type=opt.positive_int,
        default=None,
        help="answer with this version only (default: the gateway's routing: production, "
        "and the canary for its share of users)",
    )
    parser.add_argument(
        "--at",
        type=opt.non_negative_int,
        default=None,
        metavar="UNIX_TIME",
        help="the answers' request time, for a campaign sent later (default: now)",
    )
    parser.add_argument(
        "--concurrency", type=opt.positive_int, default=4, help="users answered at once"
    )


def run(args: argparse.Namespace) -> int:
    from pipelines.data.reader import list_files

    try:
        files = list_files(args.users)
    except DataError as error:
        raise UsageError(f"--users: {error}") from None
    if args.output.exists() and args.output.is_dir():
        raise UsageError(f"--output {args.output}: is a directory (give a .parquet file)")
    overrides = {} if args.version is None else {"model_version": args.version}
    from services.serving.batch import batch_settings

    settings = batch_settings(opt.settings(args, **overrides))
    written, degraded = asyncio.run(_answer(args, files, settings))
    print(f"recommend: {written} users answered -> {args.output}", flush=True)
    if degraded:  # a dependency failed: those answers are the fallback (column `degraded`)
        print(f"recommend: warning: {degraded} answers degraded", file=sys.stderr, flush=True)
    return 0


async def _answer(args: argparse.Namespace, files: list[Path], settings: Any) -> tuple[int, int]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.data.reader import read_batches
    from services.serving.batch import answer_all
    from services.serving.gateway import Gateway

    gateway = Gateway(settings)
    await gateway.start()
    temporary = args.output.with_name(f".{args.output.name}.partial")
    try:
        strings = any(r.ids.users.kind == "str" for r in gateway.releases.values())
        items_as_text = any(r.ids.items.kind == "str" for r in gateway.releases.values())
        id_type = pa.string() if strings else pa.int64()
        schema = pa.schema(
            [
                ("user_id", id_type),
                ("rank", pa.int16()),
                ("item_id", pa.string() if items_as_text else pa.int64()),
                ("score", pa.float32()),
                ("model_version", pa.int32()),
                ("degraded", pa.bool_()),
            ]
        )
        column = args.user_column
        batches = read_batches(files, [column], csv_types={column: id_type})

        def users() -> Any:
            for batch in batches:
                values = batch.data.column(0).cast(id_type).to_pylist()
                empty = [i for i, v in enumerate(values) if v is None or v == ""]
                if empty:
                    raise UsageError(
                        f"--users {batch.file}: column {column!r} has {len(empty)} empty user "
                        f"ids (first at row {batch.offset + empty[0]})"
                    )
                yield from values

        args.output.parent.mkdir(parents=True, exist_ok=True)
        done, degraded, started, shown = 0, 0, time.monotonic(), time.monotonic()
        with pq.ParquetWriter(temporary, schema) as writer:
            async for answers in answer_all(
                gateway, users(), args.k, at=args.at, concurrency=args.concurrency
            ):
                rows: dict[str, list[Any]] = {name: [] for name in schema.names}
                for answer in answers:
                    n = len(answer.items)
                    rows["user_id"] += [answer.user_id] * n
                    rows["rank"] += list(range(1, n + 1))
                    rows["item_id"] += answer.items
                    rows["score"] += answer.scores
                    rows["model_version"] += [answer.model_version] * n
                    rows["degraded"] += [answer.degraded] * n
                writer.write_table(pa.table(rows, schema=schema))
                done += len(answers)
                degraded += sum(answer.degraded for answer in answers)
                if time.monotonic() - shown >= PROGRESS_EVERY_S:
                    rate = done / (time.monotonic() - started)
                    print(f"recommend: {done} users answered ({rate:.0f}/s)", flush=True)
                    shown = time.monotonic()
        temporary.replace(args.output)  # the output appears whole, or not at all
        return done, degraded
    finally:
        temporary.unlink(missing_ok=True)
        await gateway.close()
