"""``cascade serve``: the gateway (embedded, or Redis and a real Triton); with ``--triton`` it
starts a Triton server on the export's model repository first."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from cli import materialize
from cli import options as opt


def add_parser(commands: Any) -> None:
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


def _check_triton_backends(settings: Any) -> None:
    """A GPU-target release needs backends the wheel's Triton lacks: refuse it."""
    from core.export.repository import latest_version
    from services.inference.triton_server import check_backends, wheel_directory

    serving = settings.model_version or latest_version(settings.artifacts)
    if serving is not None:
        repository = settings.artifacts / "model_repository"
        check_backends(repository, serving, wheel_directory() / "backends")


def run(args: argparse.Namespace) -> int:
    import os

    from services.api.server import serve
    from services.inference.triton_server import TritonServer

    settings = opt.settings(args)
    if args.triton:  # before anything is written or set
        _check_triton_backends(settings)
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
        materialize.run(materialize.defaults(given))
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
