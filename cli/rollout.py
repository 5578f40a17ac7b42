"""``cascade rollout VERSION`` / ``cascade rollout status``: the rollout controller's command
line (``cascade rollback`` / ``promote``: ``cli/operator.py``).

Exit codes of ``cascade rollout VERSION``: 0 promoted, 1 rolled back, 3 refused or failed,
2 a usage error (``--once``: 0 after one look, whatever it decided).

The controller holds the registry's ``rollout`` lock (ttl ``--lock-ttl``, kept by a
heartbeat); the operator's commands ask it to act while it does.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from contextlib import ExitStack
from typing import Any

from cli import options as opt
from control.rollout.analysis import AnalysisConfig
from control.rollout.controller import RolloutController, RolloutPlan, RolloutRefused
from control.rollout.state import RolloutRecord

LOCK_NAME = "rollout"
LOCK_TTL_S = 30.0  # a killed controller blocks the next one (and the operator) this long


def _settings(args: argparse.Namespace) -> Any:
    from services.settings import Settings

    overrides: dict[str, Any] = {}
    if getattr(args, "artifacts", None) is not None:
        overrides["artifacts"] = args.artifacts
    settings = Settings(**overrides)
    return settings.model_copy(update={"streams_dir": settings.embedded_streams()})


def controller_for(args: argparse.Namespace, plan: RolloutPlan | None = None) -> RolloutController:
    from control.registry import make_registry
    from control.rollout.state import make_rollout_log
    from services.serving.gateway import make_store
    from services.state.desired_state import make_desired_state_store

    settings = _settings(args)
    url, namespace = settings.redis.durable, settings.redis.namespace
    return RolloutController(
        settings.artifacts,
        make_registry(settings),
        make_desired_state_store(url, namespace, settings.artifacts),
        make_rollout_log(url, namespace, settings.artifacts),
        make_store(settings),
        plan or RolloutPlan(),
    )


def add_rollout_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "rollout",
        help="roll a validated version out step by step (or: rollout status)",
        description="Route a growing share of users to VERSION (a candidate the validation "
        "gate passed), judge it every interval against production on live traffic, promote it "
        "after the last step or roll it back when it is worse, breaks a guardrail, gets no "
        "traffic, or a replica cannot load it. Running it again resumes a running rollout. "
        "Exit code: 0 promoted, 1 rolled back, 3 refused or failed (2: a usage error).",
    )
    plan, analysis = RolloutPlan(), AnalysisConfig()
    parser.add_argument(
        "target",
        help="the version to roll out, `candidate` (the newest the gate passed), or `status`",
    )
    opt.add_artifacts(parser)
    parser.add_argument(
        "--steps",
        type=_steps,
        default=AUTO,
        help="canary weights of the steps (then promotion), or `auto`: the smallest first "
        "step of 5%%, 10%%, 25%%, 50%% at which the last 10 minutes of traffic let an "
        "equivalent candidate decide within --step-deadline-s, then 25%% and 50%% "
        "(5%% -> 25%% -> 50%% when there is no recent traffic)",
    )
    timing_and_thresholds = (
        ("--min-step-s", opt.positive_float, plan.min_step_s, "a step lasts at least this long"),
        ("--interval-s", opt.positive_float, plan.interval_s, "seconds between looks"),
        (
            "--step-deadline-s",
            opt.positive_float,
            plan.step_deadline_s,
            "a step still undecided this long ends: no_traffic when an arm got no answer, "
            "else inconclusive (see --on-inconclusive)",
        ),
        (
            "--apply-deadline-s",
            opt.positive_float,
            plan.apply_deadline_s,
            "replicas not applying a step (loading the canary) this long roll it back "
            "(not_applied); the step's other times count from when they have",
        ),
        (
            "--margin",
            opt.margin,
            analysis.non_inferiority_margin,
            "relative CTR loss the canary may show and still pass",
        ),
        (
            "--min-impressions",
            opt.positive_int,
            analysis.min_impressions,
            "per arm before the CTR test judges",
        ),
        (
            "--min-requests",
            opt.positive_int,
            analysis.min_requests,
            "per arm before the guardrails judge",
        ),
        (
            "--alpha",
            opt.probability,
            analysis.alpha,
            "error rate of the sequential tests over all looks",
        ),
    )
    for flag, parse, default, text in timing_and_thresholds:
        parser.add_argument(flag, type=parse, default=default, help=text)
    parser.add_argument(
        "--on-inconclusive",
        choices=("stay", "promote_non_inferior"),
        default=plan.on_inconclusive,
        help="a step undecided at --step-deadline-s with traffic in both arms: stay on "
        "production (rolled back, reason inconclusive), or promote a candidate a final "
        "fixed-horizon test shows non-inferior at --margin (reason non_inferior)",
    )
    parser.add_argument(
        "--cuped",
        action=argparse.BooleanOptionalAction,
        default=analysis.cuped,
        help="adjust the CTR test by each user's CTR before the rollout (CUPED: decides "
        "sooner on a fixed user population; docs/continuous-training.md)",
    )
    parser.add_argument(
        "--cuped-pre-period-s",
        type=opt.positive_float,
        default=analysis.cuped_pre_period_s,
        help="with --cuped: seconds of logged traffic before the start that give each user's CTR",
    )
    parser.add_argument(
        "--cuped-theta",
        type=_theta,
        default=analysis.cuped_theta,
        help="with --cuped: a fixed adjustment coefficient (1: the whole pre-period "
        "difference), or `fitted` (estimated at each look)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="roll out a version the gate rejected or never saw (recorded)",
    )
    parser.add_argument("--once", action="store_true", help="start or resume, look once, exit")
    parser.add_argument(
        "--plan",
        action="store_true",
        help="only forecast each step's time to a decision from the last 10 minutes of "
        "traffic and exit: 0 within --step-deadline-s, 1 not (or no traffic to plan from)",
    )
    parser.add_argument(
        "--refuse-late",
        action="store_true",
        help="refuse to start when the forecast says a step would outlast --step-deadline-s "
        "(by default a warning)",
    )
    parser.add_argument(
        "--metrics-port",
        type=opt.port_or_off,
        default=0,
        help="serve the controller's Prometheus metrics on this port (0: off)",
    )
    parser.add_argument(
        "--metrics-address",
        default="127.0.0.1",
        help="address the metrics port listens on (0.0.0.0 where Prometheus scrapes the pod)",
    )
    parser.add_argument(
        "--lock-ttl",
        type=opt.positive_float,
        default=LOCK_TTL_S,
        help="seconds the rollout lock outlives a killed controller (a heartbeat renews it "
        "every third of that while the controller runs)",
    )
    parser.add_argument("--json", action="store_true", help="status: print JSON")
    parser.add_argument(
        "--if-any",
        action="store_true",
        help="with `candidate`: exit 0 when there is none (a worker that runs on a schedule)",
    )


AUTO = "auto"


def _steps(text: str) -> tuple[float, ...] | str:
    """``--steps``: ``auto`` or increasing canary weights."""
    return AUTO if text == AUTO else opt.increasing_weights(text)


def _theta(text: str) -> float | None:
    """``--cuped-theta``: a positive number, or ``fitted`` (None)."""
    if text == "fitted":
        return None
    try:
        return opt.positive_float(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected a number > 0 or `fitted`, got {text!r}"
        ) from None


def _target_version(controller: RolloutController, target: str) -> int:
    """A version number, or `candidate`: the newest version the gate passed (what the
    retraining CronJob rolls out after `cascade retrain`)."""
    if target == "candidate":
        newest = controller.registry.newest_candidate()
        if newest is None:
            raise RolloutRefused("no candidate to roll out: `cascade versions` lists the states")
        return newest
    try:
        return int(target)
    except ValueError:
        raise RolloutRefused(
            f"rollout: expected a version number, `candidate` or `status`, got {target!r}"
        ) from None


def _plan(args: argparse.Namespace) -> RolloutPlan:
    from core.errors import UsageError

    if args.step_deadline_s < args.min_step_s:
        raise UsageError(
            f"--step-deadline-s ({args.step_deadline_s:g}) must be at least --min-step-s "
            f"({args.min_step_s:g}): every step would time out before it may end"
        )
    analysis = AnalysisConfig(
        alpha=args.alpha,
        non_inferiority_margin=args.margin,
        min_impressions=args.min_impressions,
        min_requests=args.min_requests,
        cuped=args.cuped,
        cuped_pre_period_s=args.cuped_pre_period_s,
        cuped_theta=args.cuped_theta,
    )
    return RolloutPlan(
        RolloutPlan.weights if args.steps == AUTO else args.steps,
        args.min_step_s,
        args.interval_s,
        args.step_deadline_s,
        analysis,
        apply_deadline_s=args.apply_deadline_s,
        on_inconclusive=args.on_inconclusive,
    )


def run_rollout(args: argparse.Namespace) -> int:
    if args.target == "status":
        return _status(args)
    controller = controller_for(args, _plan(args))
    if (
        args.if_any
        and args.target == "candidate"
        and controller.registry.newest_candidate() is None
    ):
        print("rollout: no candidate to roll out (nothing to do)", flush=True)
        return 0
    version = _target_version(controller, args.target)
    running = controller.log.load()
    choose = args.steps == AUTO
    if running is not None and running.status == "running" and running.version == version:
        # resuming: the steps the rollout started with
        controller.plan = dataclasses.replace(controller.plan, weights=tuple(running.weights))
        choose = False
    within = _forecast(args, controller, choose)
    if args.plan:
        return 0 if within else 1
    if within is False and args.refuse_late:
        raise RolloutRefused(
            "the forecast says a step would end inconclusive at its deadline (--refuse-late)"
        )
    if args.metrics_port:
        from prometheus_client import start_http_server

        try:
            start_http_server(args.metrics_port, addr=args.metrics_address)
        except (OSError, ValueError) as error:  # taken port, unknown address
            raise RolloutRefused(
                f"--metrics-address/--metrics-port: cannot listen on "
                f"{args.metrics_address}:{args.metrics_port} ({error})"
            ) from None
        print(
            f"rollout: metrics on http://{args.metrics_address}:{args.metrics_port}/metrics",
            flush=True,
        )
    with ExitStack() as stack:
        lock = stack.enter_context(controller.registry.lock(LOCK_NAME, ttl_s=args.lock_ttl))
        record = controller.start(version, force=args.force)
        print(
            f"rollout {record.id}: version {version} against production "
            f"{record.production}, step {record.step} at {record.weight:.0%}",
            flush=True,
        )
        record = asyncio.run(_drive(controller, lock, max_looks=1 if args.once else None))
    print_record(record)
    if args.once or record.status == "running":
        return 0
    return 0 if record.status == "promoted" else 1


def _forecast(args: argparse.Namespace, controller: RolloutController, choose: bool) -> bool | None:
    """Print the plan's forecast from the recent traffic (control.rollout.planner), with the
    steps chosen from it when ``choose`` (``--steps auto``: set on ``controller.plan``);
    whether every step decides within its deadline (None: no recent traffic to tell)."""
    from control.rollout.planner import WINDOW_S, choose_steps, forecast, measure_traffic
    from services.serving.gateway import make_store

    async def measure() -> Any:
        store = make_store(_settings(args))
        await store.start()
        try:
            return await measure_traffic(store, time.time(), WINDOW_S)
        finally:
            await store.close()

    traffic = asyncio.run(measure())
    plan = controller.plan
    if traffic.answers_per_s <= 0:
        print(
            f"plan: no traffic logged in the last {WINDOW_S:.0f} s to forecast from: the "
            "rollout's time to a decision is unknown"
            + (f"; steps {_percent(plan.weights)} (--steps auto's default)" if choose else ""),
            flush=True,
        )
        return None
    outlook = None
    if choose:  # the equivalent candidate's forecast it chose by is the one printed
        choice = choose_steps(traffic, plan)
        plan = controller.plan = dataclasses.replace(plan, weights=choice.weights)
        outlook = choice.outlook
        why = (
            "the smallest first step at which an equivalent candidate decides every step "
            f"within the {plan.step_deadline_s:.0f} s deadline"
            if choice.fits
            else "no first step lets an equivalent candidate decide within the "
            f"{plan.step_deadline_s:.0f} s deadline: the largest"
        )
        print(f"plan: --steps auto: {_percent(plan.weights)}, {why}", flush=True)
    outlook = outlook or forecast(traffic, plan)
    for line in outlook.lines(plan.step_deadline_s):
        print(line, flush=True)
    if not outlook.within_deadline:
        print("plan: WARNING: this rollout cannot decide within its deadline", flush=True)
    return outlook.within_deadline


async def _drive(controller: RolloutController, lock: Any, max_looks: int | None) -> RolloutRecord:
    """``controller.run`` with the store started, printing each new decision once."""
    last: list[Any] = [None]

    def show(record: RolloutRecord) -> None:
        decision = record.last_decision or {}
        if decision.get("look") != last[0]:
            last[0] = decision.get("look")
            print(
                f"look {last[0]}: step {record.step} ({record.weight:.0%}) "
                f"{decision.get('outcome')} ({decision.get('reason')})",
                flush=True,
            )

    await controller.store.start()
    try:
        return await controller.run(lock, max_looks, on_look=show)
    finally:
        await controller.store.close()


def print_record(record: RolloutRecord | None) -> None:
    if record is None:
        print("no rollout has run")
        return
    print(
        f"rollout {record.id}: version {record.version} vs production {record.production}: "
        f"{record.status.replace('_', ' ')}"
        + (f" ({record.reason})" if record.reason else "")
        + (f" [{record.detail}]" if record.reason == "operator" and record.detail else "")
        + f", step {record.step} at {record.weight:.0%}, {record.looks} looks"
    )
    for name, arm in sorted(record.arms.items()):
        ctr = arm.clicks / arm.impressions if arm.impressions else 0.0
        print(
            f"  {name:<8} answers {arm.requests:>7}  shown {arm.impressions:>8}  "
            f"clicks {arm.clicks:>6}  ctr {ctr:.4f}  errors {arm.errors}  "
            f"degraded {arm.degraded}  p99 {arm.p99_ms() or 0:.1f} ms"
        )


def _status(args: argparse.Namespace) -> int:
    controller = controller_for(args)
    record = controller.log.load()
    if args.json:
        print(
            json.dumps(
                {
                    "rollout": None if record is None else record.model_dump(),
                    "desired": None if (d := controller.desired.read()) is None else d.model_dump(),
                    "audit": controller.log.audit(20),
                },
                sort_keys=True,
                default=str,
            )
        )
        return 0
    print_record(record)
    if record is not None and record.last_decision:
        decision = record.last_decision
        print(f"  last look {decision['look']}: {decision['outcome']} ({decision['reason']})")
        for check in decision["checks"]:
            print(f"    {check['name']:<18} passed={check['passed']!s:<5} {check['detail']}")
    return 0


def _percent(weights: tuple[float, ...]) -> str:
    return " -> ".join(f"{w:.0%}" for w in weights)
