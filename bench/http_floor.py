"""The serving benchmark's HTTP floor: what answering a request costs with no work at all.

A bare ASGI app (no FastAPI, no stages: it drains the body and sends a fixed answer shaped
like a recommend answer of 20 items) runs on the gateway's own uvicorn options (the guarded
httptools protocol, no access log), and the same open-loop load generator drives it at a
fixed Poisson rate. The CPU-ms per request of that server and of the load generator are the
part of every request's cost that no change to the gateway's code can remove; with the
compute floor they bound the rate the machine can carry (``capacity``).

    python bench/http_floor.py --port 8123   # serve the bare app (what the benchmark starts)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from openloop import Probe, ProcessGroup, open_loop

HERE = Path(__file__).resolve().parent
ANSWER = json.dumps(
    {
        "user_id": 1,
        "version": "v0000000000",
        "degraded": False,
        "degraded_stages": [],
        "timings_ms": {},
        "items": [
            {"item_id": 100_000 + i, "score": round(0.9 - i / 100, 6), "source": "ann"}
            for i in range(20)
        ],
    }
).encode()
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The bare app: every HTTP request gets ``ANSWER`` (lifespan events are acknowledged)."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})


def measure(rate: float, seconds: float, wait_for: Any, stop: Any) -> Probe:
    """Start the bare server on a free loopback port, drive it at ``rate`` for ``seconds``
    after a short warm-up, stop it (``wait_for(url, timeout_s)`` and ``stop(process)`` are the
    benchmark's); the probe (the server's CPU under ``http_server``, the load generator's
    under ``load_generator``)."""
    from services.util.local_redis import free_port

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(HERE / "http_floor.py"), "--port", str(port)], cwd=HERE.parent
    )
    try:
        wait_for(f"http://127.0.0.1:{port}/", 60)
        group = ProcessGroup()
        group.add("http_server", process.pid)
        url = f"http://127.0.0.1:{port}/v1/recommend"
        asyncio.run(open_loop(url, [1], min(rate, 50.0), 2.0, 20, group))  # warm-up
        return asyncio.run(open_loop(url, [1], rate, seconds, 20, group))
    finally:
        stop(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="loopback port to listen on")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE.parent))
    import uvicorn

    from services.api.server import server_options
    from services.settings import Settings

    uvicorn.run(app, host="127.0.0.1", port=args.port, **server_options(Settings()))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
