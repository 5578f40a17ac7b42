"""``cascade retrain --from-queue``: one queued retrain request, run by the usual job.

The request (enqueued by the alert webhook) is claimed under a lease that a thread renews
while the job runs. Exit 0 or 1 (a verdict was registered): the request is removed. Any other
exit (3: an error, e.g. another retrain holds the lock): it stays queued and the next run
takes it again once its lease has expired, so a failed or killed run never loses a request.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections.abc import Callable
from typing import Any


def run_from_queue(
    args: argparse.Namespace, run_once: Callable[[argparse.Namespace, dict[str, Any]], int]
) -> int:
    """Claim one request and run ``run_once(args, trigger)`` for it (see the docstring)."""
    from pydantic import ValidationError

    from core.exit_codes import EXIT_OK, EXIT_REJECTED, fail
    from services.errors import DependencyUnavailable
    from services.settings import Settings
    from services.state.retrain_queue import leased, make_retrain_queue

    consumer = f"{socket.gethostname()}:{os.getpid()}"
    try:
        settings = Settings(**({"artifacts": args.artifacts} if args.artifacts else {}))
        lease_s = settings.retrain_trigger.lease_s
        queue = make_retrain_queue(settings)
    except ValidationError as error:
        return fail(error, "cascade retrain")
    try:
        request = queue.claim(consumer, lease_s)
        if request is None:
            print(json.dumps({"queued": 0, "ran": None}), flush=True)
            return EXIT_OK
        print(f"retrain request {request.id} (enqueued at {request.enqueued_at:.0f})", flush=True)
        with leased(queue, request, consumer, lease_s):
            code = run_once(args, {**request.trigger, "request_id": request.id})
        if code not in (EXIT_OK, EXIT_REJECTED):  # no verdict: the request is kept
            print(
                f"cascade retrain: request {request.id} stays queued; it is taken again after "
                f"its lease ({lease_s:g} s)",
                file=sys.stderr,
            )
            return code
        queue.complete(request)
        return code
    except DependencyUnavailable as error:
        return fail(error, "cascade retrain")
    finally:
        queue.close()
