"""`cascade retrain` end to end: a blessed candidate and a sabotaged one, each with its verdict.

On a private redis-server (streams and registry) and a fresh export root:

1. first deploy: `cascade retrain` on the oldest ``--base-fraction`` of the data set (floors
   only; the version becomes production when the next run adopts it);
2. the newest part of the data set is replayed as logged traffic (feedback + impressions
   streams, the users' real choices: see ``control/retrain/replay.py``);
3. `cascade retrain` again: the good candidate, timed (``retrain_s``), gated against
   production on the most recent window;
4. `cascade retrain --sabotage shuffled-embeddings`: the bad candidate, which must fail.

Prints each run's verdict table and, as its last line, one JSON object (also written to
``bench/results/retrain.json``)::

    .venv/bin/python bench/retrain.py                      # MovieLens-100K
    .venv/bin/python bench/retrain.py --dataset synthetic --users 20000 --items 1000000 \\
        --interactions 2000000                              # 1M items
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from publish import publish

from cli.main import main
from control.retrain.replay import replay_records, write_records
from pipelines.pipeline import load_dataset
from services.stores.redis import RedisStore
from services.util.local_redis import start_redis_server

SMALL_HOLDOUT_GATE = (
    Path(__file__).resolve().parents[1] / "control" / "validation" / "gate-small-holdout.yaml"
)


def _retrain(args: list[str]) -> tuple[int, str, float]:
    printed = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(printed):
        code = main(["retrain", *args])
    text = printed.getvalue()
    table = [
        line for line in text.splitlines() if not line.startswith("[retrain") or "SABOTAGE" in line
    ]
    print("\n".join(table), flush=True)
    return code, text, time.perf_counter() - started


def _summary(code: int, text: str) -> dict:
    result = json.loads(text.strip().splitlines()[-1])
    return {**result, "exit_code": code}


def run(options: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="cascade-retrain-") as temporary:
        directory = Path(temporary)
        (directory / "redis").mkdir()
        url, redis_process = start_redis_server(directory / "redis")
        os.environ["CASCADE_REDIS__URL"] = url
        os.environ["CASCADE_REDIS__NAMESPACE"] = "bench"
        try:
            common = [
                "--artifacts",
                str(directory / "artifacts"),
                "--dataset",
                options.dataset,
                "--users",
                str(options.users),
                "--items",
                str(options.items),
                "--interactions",
                str(options.interactions),
                "--base-fraction",
                str(options.base_fraction),
                "--two-tower-epochs",
                str(options.two_tower_epochs),
                "--bpr-epochs",
                "1",
                "--dlrm-epochs",
                str(options.dlrm_epochs),
                "--gbm-rounds",
                str(options.gbm_rounds),
            ]
            if options.gate_config:
                common += ["--gate-config", options.gate_config]
            print("== 1. first deploy (floors only)", flush=True)
            first_code, first_text, first_s = _retrain(common)

            dataset = load_dataset(
                options.dataset, 0, (options.users, options.items, options.interactions)
            )
            feedback, impressions = replay_records(dataset, options.base_fraction)

            async def replay() -> None:
                store = RedisStore(url, "bench")
                await store.start()
                try:
                    await write_records(store, feedback, impressions)
                finally:
                    await store.close()

            asyncio.run(replay())
            print(
                f"== 2. replayed {len(feedback)} feedback events and {len(impressions)} "
                "impression sets; retrain (good candidate)",
                flush=True,
            )
            good_code, good_text, good_s = _retrain(common)
            print("== 3. retrain --sabotage shuffled-embeddings (bad candidate)", flush=True)
            bad_code, bad_text, _ = _retrain([*common, "--sabotage", "shuffled-embeddings"])
        finally:
            redis_process.terminate()
            redis_process.wait(10)
    good, bad = _summary(good_code, good_text), _summary(bad_code, bad_text)
    return {
        "dataset": options.dataset,
        "items": None if options.dataset == "movielens" else options.items,
        "retrain_s": round(good_s, 1),
        "first_deploy": {**_summary(first_code, first_text), "seconds": round(first_s, 1)},
        "good": {k: good[k] for k in ("verdict", "version", "failed_checks", "exit_code")},
        "bad": {k: bad[k] for k in ("verdict", "version", "failed_checks", "exit_code")},
    }


def main_cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=["movielens", "synthetic"], default="movielens")
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--interactions", type=int, default=2_000_000)
    parser.add_argument("--base-fraction", type=float, default=0.8)
    parser.add_argument("--two-tower-epochs", type=int, default=10)
    parser.add_argument("--dlrm-epochs", type=int, default=3)
    parser.add_argument("--gbm-rounds", type=int, default=200)
    parser.add_argument(
        "--gate-config",
        default=str(SMALL_HOLDOUT_GATE),
        help="gate YAML (default: the small-holdout margins; see that file)",
    )
    result = run(parser.parse_args())
    publish("retrain", result)


if __name__ == "__main__":
    main_cli()
