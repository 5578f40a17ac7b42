"""``cascade retrain``: the parser and the runner (the CLI's table points here).

Exit codes (core/exit_codes.py): 0 a candidate was registered (the gate passed, or
failed with ``--force``), 1 the gate rejected the candidate (registered as rejected), 2 a
usage error (argparse), 3 an error (nothing registered; a later run cleans up what this one
left).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from cli import options as opt


def add_parser(commands: Any) -> None:
    from pipelines.config import TrainConfig

    parser = commands.add_parser(
        "retrain",
        help="retrain on the base data + logged outcomes, gate the candidate, register it",
        description="Snapshot the feedback and impression streams since the last retrain "
        "(to parquet under <artifacts>/retrain/), append the logged outcomes to the base data "
        "set, split (the most recent window of rows no serving model chose, minus what "
        "production learnt, is the holdout; answers the gateway served are never judged), "
        "train the two-tower, "
        "DLRM and trees, export a new version, run the validation gate against production on "
        "the holdout, write releases/<v>/validation.json, print the verdict table and "
        "register the version (candidate or rejected). One retrain at a time (a lock that "
        "expires if the job dies). Streams come from CASCADE_REDIS__URL, else from the "
        "embedded gateway's files in CASCADE_STREAMS_DIR; the registry likewise. "
        "Exit codes: 0 candidate registered (passed, or --force), 1 rejected by the gate, "
        "2 usage error, 3 error (nothing registered).",
    )
    opt.add_artifacts(parser)
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="cursor, snapshots, journal and work directory (default: <artifacts>/retrain)",
    )
    opt.add_dataset_options(
        parser,
        "the base data set the logged outcomes are appended to (default: the data production "
        "was trained on, as its manifest records: a built-in name or a dataset file, whose "
        "logs may have grown; else movielens)",
        default=None,
    )
    parser.add_argument("--users", type=opt.positive_int, default=10_000, help="synthetic: users")
    parser.add_argument("--items", type=opt.positive_int, default=5_000, help="synthetic: items")
    parser.add_argument(
        "--interactions", type=opt.positive_int, default=200_000, help="synthetic: interactions"
    )
    parser.add_argument(
        "--base-fraction",
        type=opt.fraction,
        default=1.0,
        help="use only the oldest fraction of the base interactions (the rest is what "
        "bench/retrain.py replays as traffic; default 1.0, keep it in production)",
    )
    parser.add_argument(
        "--gate-config",
        type=Path,
        default=None,
        help="gate thresholds YAML (default: control/validation/gate.yaml)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="register a candidate that failed the gate (recorded in the verdict)",
    )
    parser.add_argument(
        "--sabotage",
        choices=["shuffled-embeddings"],
        default=None,
        help="FOR DEMOS AND TESTS: permute the item embeddings before the export, so the gate "
        "must reject the candidate (default: none)",
    )
    parser.add_argument(
        "--gc-keep",
        type=opt.non_negative_int,
        default=None,
        help="after registering, remove old versions beyond the newest N "
        "(never production, previous production or canary; default: remove none)",
    )
    parser.add_argument(
        "--lock-ttl",
        type=opt.positive_float,
        default=30.0,
        help="seconds the lock outlives a killed job (a heartbeat renews it every third of "
        "that while the job runs; default 30)",
    )
    parser.add_argument(
        "--from-queue",
        action="store_true",
        help="take one request from the retrain queue (enqueued by the alert webhook, "
        "POST /v1/admin/alerts) and retrain for it, recording its alerts in the journal and "
        "the version's manifest (training_data.trigger); nothing queued: exit 0 at once. The "
        "request stays leased while the job runs and is removed once it ran to a verdict; if "
        "the job fails or dies, the next --from-queue run takes it again",
    )
    opt.add_config_options(parser, TrainConfig)


def run(args: argparse.Namespace) -> int:
    """Under torchrun, rank 0 runs the job and the other ranks join its data-parallel
    training steps (``pipelines/training/distributed.py``)."""
    from pipelines.training import distributed

    return distributed.lead_or_follow(lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    if getattr(args, "from_queue", False):
        from control.retrain.from_queue import run_from_queue

        return run_from_queue(args, _run_once)
    return _run_once(args)


def _run_once(args: argparse.Namespace, trigger: dict[str, Any] | None = None) -> int:
    from control.registry import adopt_served, make_registry
    from control.retrain.job import RetrainOptions, run_retrain
    from core.exit_codes import fail
    from core.files import writable_dir
    from pipelines.config import TrainConfig
    from services.settings import Settings
    from services.state.desired_state import pin_production

    try:
        settings = Settings(**({"artifacts": args.artifacts} if args.artifacts else {}))
        writable_dir(settings.artifacts)  # before an hour of training, not after it
        writable_dir(args.state_dir or settings.artifacts / "retrain")
        overrides = {
            k: getattr(args, k) for k in TrainConfig.model_fields if getattr(args, k) is not None
        }
        options = RetrainOptions(
            artifacts=settings.artifacts,
            config=TrainConfig(**overrides),
            state_dir=args.state_dir,
            dataset=opt.dataset_source(args),
            synthetic_size=(args.users, args.items, args.interactions),
            base_fraction=args.base_fraction,
            gate_config=args.gate_config,
            force=args.force,
            sabotage=args.sabotage,
            gc_keep=args.gc_keep,
            lock_ttl_s=args.lock_ttl,
            trigger=trigger,
        )
        registry = make_registry(settings)
        try:
            outcome = run_retrain(
                options,
                settings,
                registry,
                lambda: adopt_served(registry, settings.artifacts),
                log=lambda line: print(line, flush=True),
            )
            pin_production(settings, registry.production())
        finally:
            registry.close()
    except Exception as error:  # Redis down, disk full...: exit 3, never mistaken for "rejected"
        return fail(error, "cascade retrain")
    verdict = outcome.verdict
    print(
        json.dumps(
            {
                "version": outcome.version,
                "verdict": "pass" if verdict.passed else "fail",
                "forced": verdict.forced,
                "failed_checks": verdict.failed_checks,
                "validation": str(
                    settings.artifacts / "releases" / str(outcome.version) / "validation.json"
                ),
                "seconds": round(outcome.seconds, 1),
            }
        ),
        flush=True,
    )
    return outcome.exit_code
