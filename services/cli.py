"""The ``cascade`` command line.

``cascade train`` runs the offline pipeline (with no arguments: the whole pipeline on
MovieLens-100K) and prints the path of its ``report.json`` as its last line.
``cascade serve`` starts the gateway; ``cascade materialize`` fills the online store.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipelines.config import TrainConfig
from pipelines.errors import CascadeError, UsageError
from services import cli_options as opt
from services import simulator
from services.exit_codes import EPILOG, fail
from services.util.redact import redact_url


def _train_parser(commands: Any) -> None:
    from pipelines.config import STEPS

    parser = commands.add_parser(
        "train",
        help="run the offline pipeline (data, features, training, evaluation, export)",
        description="Run the offline pipeline. With no steps named, runs all of them in order: "
        + ", ".join(STEPS)
        + ". Each step reads what the previous one wrote into --workdir.",
    )
    parser.add_argument(
        "steps",
        nargs="*",
        choices=[[], *STEPS],
        metavar="STEP",
        help=f"steps to run, from {', '.join(STEPS)} (default: all)",
    )
    parser.add_argument(
        "--dataset",
        choices=["movielens", "synthetic"],
        default="movielens",
        help="MovieLens-100K (from the recbole wheel) or the synthetic generator",
    )
    parser.add_argument(
        "--users", type=opt.positive_int, default=10_000, help="synthetic: number of users"
    )
    parser.add_argument(
        "--items", type=opt.positive_int, default=5_000, help="synthetic: number of items"
    )
    parser.add_argument(
        "--interactions",
        type=opt.positive_int,
        default=200_000,
        help="synthetic: number of interactions",
    )
    parser.add_argument(
        "--base-fraction",
        type=opt.fraction,
        default=1.0,
        help="train on the oldest fraction of the interactions only (by time): the newer "
        "ones are what arrives after this version, for `cascade retrain` to learn and the "
        "gate to judge on (the retrain walkthrough; default 1.0: all)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path("artifacts/work"),
        help="where intermediate data, models and the report go",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=Path("artifacts"),
        help="root of the versioned export (model_repository/ and releases/)",
    )
    opt.add_config_options(parser, TrainConfig)


def _run_train(args: argparse.Namespace) -> int:
    from pipelines.pipeline import STEPS, run_pipeline

    overrides = {
        k: getattr(args, k) for k in TrainConfig.model_fields if getattr(args, k) is not None
    }
    config = TrainConfig(**overrides)
    opt.writable_dir(args.workdir)
    if "export" in (args.steps or STEPS):
        opt.writable_dir(args.output)
    report = run_pipeline(
        args.workdir,
        args.output,
        config,
        steps=tuple(args.steps) or STEPS,
        dataset=args.dataset,
        synthetic_size=(args.users, args.items, args.interactions),
        base_fraction=args.base_fraction,
    )
    if report is None:
        return 0
    summary = json.loads(report.read_text())
    for section in ("retrieval", "ranking"):
        print(f"{section} (test):")
        for model, metrics in summary[section]["metrics"].items():
            print(f"  {model:<11} " + "  ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
    print(report.resolve())
    return 0


def _serve_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "serve",
        help="serve POST /v1/recommend (embedded default, or Redis + a real Triton)",
        description="Start the gateway. Settings come from CASCADE_* environment variables "
        "(see services/settings.py). With --triton, a Triton server from the "
        "nvidia-pytriton wheel is started on the export's model repository first.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind")
    parser.add_argument("--port", type=opt.port, default=8080, help="port of the gateway")
    opt.add_artifacts(parser)
    parser.add_argument(
        "--triton", action="store_true", help="start a local Triton server and use it"
    )
    parser.add_argument(
        "--triton-http-port",
        type=opt.number(int, ge=1, le=65535 - 2),
        default=8000,
        help="Triton HTTP port; gRPC and metrics take the next two (with --triton)",
    )
    parser.add_argument(
        "--triton-address",
        default="127.0.0.1",
        help="address Triton's HTTP, gRPC and metrics ports bind to (with --triton); model "
        "control needs the key CASCADE_TRITON__CONTROL_KEY (random per start when unset)",
    )
    parser.add_argument(
        "--triton-log-max-bytes",
        type=opt.number(int, ge=1024),
        default=10 << 20,
        help="size at which artifacts/tritonserver.log is rotated (with --triton)",
    )
    parser.add_argument(
        "--triton-log-backups",
        type=opt.non_negative_int,
        default=3,
        help="rotated Triton logs kept: tritonserver.log.1 .. .N (with --triton)",
    )
    parser.add_argument(
        "--materialize", action="store_true", help="load the release's users into Redis first"
    )
    parser.add_argument(
        "--workers", type=opt.positive_int, default=1, help="uvicorn worker processes"
    )
    parser.add_argument(
        "--open-feedback",
        action="store_true",
        help="accept POST /v1/feedback without a client key (local experiments only; said "
        "at start-up and in /health/ready). Default: a key is required; on the embedded stack "
        "without one configured, the key in <artifacts>/feedback.key (written at first start)",
    )


def _materialize_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "materialize",
        help="load a release's users, histories and seen sets into the online store",
        description="Write every user of a release (attributes, recent history, seen items) into "
        "the Redis at CASCADE_REDIS__URL (or --redis-url), pipelined and versioned.",
    )
    opt.add_artifacts(parser)
    parser.add_argument(
        "--version", type=opt.positive_int, default=None, help="release version (default: latest)"
    )
    parser.add_argument(
        "--redis-url", default=None, help="redis://host:port/db (default: CASCADE_REDIS__URL)"
    )
    parser.add_argument(
        "--candidate",
        action="store_true",
        help="the newest candidate the gate passed instead of --version; none: exit 0 "
        "(a worker that runs on a schedule)",
    )


def _settings(args: argparse.Namespace, **overrides: Any) -> Any:
    from services.settings import Settings

    if args.artifacts is not None:
        overrides["artifacts"] = args.artifacts
    return Settings(**overrides)


def _materialize_args(argv: list[str]) -> argparse.Namespace:
    """``cascade materialize``'s arguments as its own parser reads ``argv``: every option it
    has gets its default (``serve --materialize`` runs it without spelling them out)."""
    parser = argparse.ArgumentParser(prog="cascade")
    _materialize_parser(parser.add_subparsers())
    return parser.parse_args(["materialize", *argv])


def _run_materialize(args: argparse.Namespace) -> int:
    import asyncio

    from pipelines.export.repository import latest_version
    from services.materialize import materialize
    from services.stores.redis import RedisStore

    settings = _settings(args)
    url = args.redis_url or settings.redis.url
    if not url:
        raise CascadeError("no Redis to materialize into: set CASCADE_REDIS__URL or --redis-url")
    if args.candidate and args.version is not None:
        raise UsageError("--candidate and --version exclude each other")
    if args.candidate:
        from services.control.registry import RedisRegistry

        registry = RedisRegistry(url, settings.redis.namespace)
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
        store = RedisStore(url, settings.redis.namespace)
        await store.start()
        try:
            return await materialize(store, settings.artifacts / "releases" / str(version))
        finally:
            await store.close()

    from redis.exceptions import RedisError

    from services.embedding_cache.backing import RedisRows
    from services.materialize import materialize_embeddings

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


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _feedback_keys(args: argparse.Namespace, settings: Any) -> Any:
    """``--open-feedback``: accept feedback without a key (said loudly). Else, on the
    embedded stack (no Redis) with no key configured: the key in <artifacts>/feedback.key,
    written at the first start, so local feedback needs a key too."""
    import os

    from services.api.credentials import ensure_key_file, feedback_auth

    feedback = settings.feedback
    if args.open_feedback:
        os.environ["CASCADE_FEEDBACK__OPEN"] = "true"
        feedback = feedback.model_copy(update={"open": True})
    elif feedback_auth(feedback) == "off" and not settings.redis.url:
        path = settings.artifacts / "feedback.key"
        written = ensure_key_file(path)
        os.environ["CASCADE_FEEDBACK__KEYS_FILE"] = str(path)
        feedback = feedback.model_copy(update={"keys_file": path})
        print(
            f"feedback: clients send the key {'written to' if written else 'in'} {path} "
            "(Authorization: Bearer <key>; `cascade simulate` reads it from there)",
            flush=True,
        )
    return settings.model_copy(update={"feedback": feedback})


def _run_serve(args: argparse.Namespace) -> int:
    import os

    from services.api.server import serve
    from services.triton_server import TritonServer

    settings = _settings(args)
    if args.workers > 1 and not settings.redis.url:
        print(
            f"warning: --workers {args.workers} without CASCADE_REDIS__URL: each worker keeps "
            "its own in-memory store, so a click reaching another worker than the one that "
            "answered is unattributed; set a Redis for more than one worker",
            file=sys.stderr,
            flush=True,
        )
    streams = settings.embedded_streams()
    if streams is not None:  # the embedded stack logs where `cascade retrain` reads
        os.environ["CASCADE_STREAMS_DIR"] = str(streams)
    settings = _feedback_keys(args, settings)
    # uvicorn re-raises SIGTERM after its graceful shutdown; as SystemExit it runs the
    # `finally` below, so the Triton server this command started is stopped too
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if args.materialize:  # first: the ranker (in Triton or in process) loads rows from Redis
        given = ["--artifacts", str(args.artifacts)] if args.artifacts is not None else []
        _run_materialize(_materialize_args(given))
    server = None
    if args.triton:
        key = settings.triton.control_key
        # the query tower's stub only where it serves (CASCADE_TRITON__QUERY_TOWER=triton)
        on_triton = ("query_tower",) if settings.triton.query_tower == "triton" else ()
        server = TritonServer(
            settings.artifacts / "model_repository",
            models=(*on_triton, "ranker"),
            http_port=args.triton_http_port,
            grpc_port=args.triton_http_port + 1,
            metrics_port=args.triton_http_port + 2,
            log_file=settings.artifacts / "tritonserver.log",
            address=args.triton_address,
            control_key=key.get_secret_value() if key is not None else None,
            log_max_bytes=args.triton_log_max_bytes,
            log_backups=args.triton_log_backups,
        )
        print(f"starting tritonserver on {server.http_url} (log: {server.log_file})", flush=True)
        server.start()
        os.environ["CASCADE_TRITON__URL"] = server.http_url
        os.environ["CASCADE_TRITON__CONTROL_KEY"] = server.control_key  # for the gateway
    try:
        if args.artifacts is not None:
            os.environ["CASCADE_ARTIFACTS"] = str(args.artifacts)
        serve(args.host, args.port, args.workers, settings)
    finally:
        if server is not None:
            server.stop()
    return 0


def _commands() -> dict[str, tuple[Callable[[Any], None], Callable[[argparse.Namespace], int]]]:
    """Every subcommand: name -> (add its parser, run it). Commands of other modules are
    imported lazily by their run function, so `cascade --help` stays fast."""
    from pipelines.retrain import command as retrain_command
    from services.control import commands as control
    from services.control import rollout_commands as rollout
    from services.monitoring import report

    return {
        "train": (_train_parser, _run_train),
        "serve": (_serve_parser, _run_serve),
        "materialize": (_materialize_parser, _run_materialize),
        "versions": (control.versions_parser, control.run_versions),
        "gc": (control.gc_parser, control.run_gc),
        "simulate": (simulator.add_parser, simulator.run),
        "retrain": (retrain_command.add_parser, retrain_command.run),
        "rollout": (rollout.add_rollout_parser, rollout.run_rollout),
        "rollback": (rollout.add_rollback_parser, rollout.run_rollback),
        "promote": (rollout.add_promote_parser, rollout.run_promote),
        "report": (report.add_parser, report.run),
    }


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cascade-recsys")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    """``cascade`` and every subcommand, each option's help ending with its default."""
    parser = argparse.ArgumentParser(
        prog="cascade",
        description="Cascade: multi-stage recommendation.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"cascade {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    for add_parser, _ in _commands().values():
        add_parser(commands)
    for command in commands.choices.values():
        command.formatter_class = opt.HelpWithDefaults
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    table = _commands()
    args = parser.parse_args(argv)
    if args.command == "serve":  # a line per state change and one when ready, with times
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        logging.getLogger("faiss").setLevel(logging.WARNING)  # its loader's INFO lines are noise
    try:
        return table[args.command][1](args)
    except Exception as error:  # one line and an exit code (services/exit_codes.py)
        usage = isinstance(error, UsageError)
        return fail(error, f"cascade {args.command}" if usage else "cascade")


if __name__ == "__main__":
    sys.exit(main())
