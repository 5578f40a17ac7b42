"""``cascade rollback`` / ``cascade promote``: an operator ends the running rollout now.

They take the registry's ``rollout`` lock and act when it is free; while a controller holds
it they leave it a request (``RolloutLog.put_request``) and wait for it to be honoured
(``--wait-s``), taking over if the controller dies meanwhile.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from cli import options as opt
from cli.rollout import LOCK_NAME, LOCK_TTL_S, controller_for, print_record
from control.registry import HOLDER, LockHeld
from control.rollout.controller import RolloutController, RolloutRefused
from control.rollout.state import Action, OperatorRequest, RolloutRecord

OPERATOR_WAIT_S = 60.0
OPERATOR_POLL_S = 0.2


def _operator_options(parser: argparse.ArgumentParser) -> None:
    opt.add_artifacts(parser)
    parser.add_argument("--reason", default="manual", help="recorded in the audit trail")
    parser.add_argument(
        "--wait-s",
        type=opt.non_negative_float,
        default=OPERATOR_WAIT_S,
        help="while a controller drives the rollout: how long to wait for it to act on "
        "the request (it does within about a second between looks)",
    )


def add_rollback_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "rollback",
        help="roll the running rollout back now (or undo the last promotion)",
        description="With a rollout running: take the canary out at once (production "
        "untouched), reason `operator`; when a controller drives it, it is asked to, and "
        "this waits until it has. With none: make the previous production the production "
        "again.",
    )
    _operator_options(parser)


def run_rollback(args: argparse.Namespace) -> int:
    controller, record = _operator(args, "rollback")
    desired = controller.desired.read()
    print(f"rolled back; serving production {desired.production if desired else '?'}")
    print_record(record)
    return 0


def add_promote_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "promote",
        help="promote the running rollout's canary now (recorded)",
        description="Make the running rollout's canary the production version without "
        "waiting for its analysis (reason `operator`, with --reason in the audit trail); "
        "when a controller drives it, it is asked to, and this waits until it has.",
    )
    _operator_options(parser)


def run_promote(args: argparse.Namespace) -> int:
    _, record = _operator(args, "promote")
    print_record(record)
    return 0


def _operator(
    args: argparse.Namespace, action: Action
) -> tuple[RolloutController, RolloutRecord | None]:
    """Roll back or promote under the ``rollout`` lock; while a controller holds it, leave
    it a request for the running rollout and wait (``--wait-s``) until it has acted, or
    until its lock is free (it died: act here). Returns the record acted on."""
    from redis.exceptions import RedisError

    controller = controller_for(args)
    try:
        return controller, _act_or_request(controller, args, action)
    except RedisError as error:  # the rollout record's or the desired state's Redis
        raise RolloutRefused(f"{action}: the rollout's store cannot be reached ({error})") from None


def _act_or_request(
    controller: RolloutController, args: argparse.Namespace, action: Action
) -> RolloutRecord | None:
    """``_operator``'s loop: act under the lock, or request and wait for the controller."""
    deadline = time.monotonic() + args.wait_s
    requested: OperatorRequest | None = None

    def answered() -> RolloutRecord | None:
        """The rollout the request was for, once it has ended (None before)."""
        record = controller.log.load()
        if requested is None or record is None or record.id != requested.rollout:
            return None
        return None if record.status == "running" else _honoured(record, action)

    while True:
        try:
            with controller.registry.lock(LOCK_NAME, ttl_s=LOCK_TTL_S):
                record = answered()  # the controller may have acted and exited meanwhile
                if record is not None:
                    return record
                if action == "rollback":
                    return controller.rollback(args.reason)
                return controller.promote(args.reason)
        except LockHeld as error:
            held = error
        if (record := answered()) is not None:
            return record
        current = controller.log.load()
        if requested is None and current is not None and current.status == "running":
            requested = OperatorRequest(
                action=action, rollout=current.id, reason=args.reason, by=HOLDER
            )
            controller.log.put_request(requested)
            print(
                f"{action} of rollout {current.id} requested from its controller ({held}); "
                f"waiting up to {args.wait_s:g} s",
                flush=True,
            )
        if time.monotonic() >= deadline:
            if requested is None:
                raise RolloutRefused(f"{held}; no rollout is running for it to {action}")
            raise RolloutRefused(
                f"the controller did not {action} rollout {requested.rollout} within "
                f"{args.wait_s:g} s ({held}); the request stands: it acts on it at its next "
                "look (`cascade rollout status`)"
            )
        time.sleep(OPERATOR_POLL_S)


def _honoured(record: RolloutRecord, action: Action) -> RolloutRecord:
    """The rollout the request was for has ended: as asked, or on its own just before."""
    wanted = "rolled_back" if action == "rollback" else "promoted"
    if record.status == wanted:
        return record
    again = "; `cascade rollback` again restores the previous production"
    raise RolloutRefused(
        f"rollout {record.id} was {record.status.replace('_', ' ')} ({record.reason}) "
        f"before its controller saw the {action} request{again if action == 'rollback' else ''}"
    )
