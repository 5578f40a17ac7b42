"""The README's walkthrough, repeated: how the small-holdout gate's verdict spreads.

For each ``--train-seeds`` value, in a fresh folder: ``cascade train --base-fraction 0.8``
(version 1), ``cascade serve`` on the embedded stack, ``cascade simulate`` (its ``--seed``
is the train seed), then for each ``--retrain-seeds`` value ``cascade retrain --seed S
--gate-config <gate>`` (an equal candidate: same recipe, other initialisation and batch
order), and one ``--sabotage shuffled-embeddings`` retrain. Every run's non-inferiority
checks (point estimate, interval, outcome) come from its ``validation.json``.

Per metric it prints the spread of the lower bounds and the largest margin the equal
candidates needed, and the sabotaged candidates' upper bounds (the margin must stay above
them); the last line is one JSON object (also ``bench/results/walkthrough.json``)::

    .venv/bin/python bench/walkthrough.py --train-seeds 0 1 --retrain-seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from publish import publish

from services.util.local_redis import free_port

REPO = Path(__file__).resolve().parents[1]
CASCADE = str(REPO / ".venv" / "bin" / "cascade")
GATE = REPO / "control" / "validation" / "gate-small-holdout.yaml"


def _env() -> dict[str, str]:
    """The embedded stack: no Redis, no settings from the caller's environment."""
    return {k: v for k, v in os.environ.items() if not k.startswith("CASCADE_")}


def _cascade(*args: str, check: bool = True) -> tuple[int, str, float]:
    started = time.perf_counter()
    done = subprocess.run(
        [CASCADE, *args], env=_env(), cwd=REPO, capture_output=True, text=True, check=False
    )
    if check and done.returncode not in (0, 1):
        raise RuntimeError(f"cascade {' '.join(args)}: exit {done.returncode}\n{done.stderr}")
    return done.returncode, done.stdout, time.perf_counter() - started


def _wait_ready(url: str, process: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"cascade serve exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health/ready", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"cascade serve not ready after {timeout_s} s")


def _checks(root: Path, version: int) -> dict[str, Any]:
    verdict = json.loads((root / "releases" / str(version) / "validation.json").read_text())
    return {
        "verdict": verdict["verdict"],
        "failed": verdict["failed_checks"],
        "holdout": verdict["holdout"],
        "checks": {
            c["name"]: {"value": c["value"], "interval": c["interval"], "outcome": c["outcome"]}
            for c in verdict["checks"]
            if c["kind"] == "non_inferiority"
        },
    }


def _retrain(root: Path, gate: Path, train_args: list[str], *extra: str) -> dict[str, Any]:
    code, out, seconds = _cascade(
        "retrain", "--artifacts", str(root), "--gate-config", str(gate), *train_args, *extra
    )
    summary = json.loads(out.strip().splitlines()[-1])
    record = {"exit": code, "seconds": round(seconds, 1), "version": summary["version"]}
    record.update(_checks(root, summary["version"]))
    print(
        f"  retrain {' '.join(extra)}: exit {code}, {seconds:.0f} s, {record['verdict']}; "
        + "; ".join(
            f"{name.split('.', 1)[1]} {c['value']:+.3f} [{c['interval'][0]:+.3f}, "
            f"{c['interval'][1]:+.3f}]"
            for name, c in record["checks"].items()
        ),
        flush=True,
    )
    return record


def walkthrough(folder: Path, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One walkthrough in ``folder``: train, serve + simulate, the retrains."""
    train_args = args.train_args.split()
    code, _, train_s = _cascade(
        "train", "--base-fraction", "0.8", "--workdir", str(folder / "work"),
        "--output", str(folder), "--seed", str(seed), *train_args,
    )  # fmt: skip
    if code:
        raise RuntimeError(f"cascade train exit {code}")
    print(f"seed {seed}: train {train_s:.0f} s", flush=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = subprocess.Popen(
        [CASCADE, "serve", "--artifacts", str(folder), "--port", str(port)],
        env=_env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_ready(url, serve)
        _, out, _ = _cascade(
            "simulate", "--url", url, "--feedback-key-file", str(folder / "feedback.key"),
            "--rate", str(args.rate), "--duration", str(args.duration), "--seed", str(seed),
        )  # fmt: skip
        simulated = json.loads(out.strip().splitlines()[-1])
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(60)
    runs = [_retrain(folder, args.gate, train_args, "--seed", str(s)) for s in args.retrain_seeds]
    sabotaged = (
        _retrain(folder, args.gate, train_args, "--sabotage", "shuffled-embeddings")
        if args.sabotage
        else None
    )
    return {
        "seed": seed,
        "train_s": round(train_s, 1),
        "simulated": simulated,
        "equal": runs,
        "sabotaged": sabotaged,
    }


def summarise(walks: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric: the equal candidates' lower bounds, the margin each needed, the
    sabotaged ones' upper bounds."""
    equal = [r for w in walks for r in w["equal"]]
    bad = [w["sabotaged"] for w in walks if w["sabotaged"]]
    out: dict[str, Any] = {"equal_runs": len(equal), "sabotaged_runs": len(bad), "metrics": {}}
    for metric in equal[0]["checks"] if equal else []:
        lows = np.array([r["checks"][metric]["interval"][0] for r in equal])
        points = np.array([r["checks"][metric]["value"] for r in equal])
        highs_bad = [b["checks"][metric]["interval"][1] for b in bad]
        out["metrics"][metric] = {
            "point_mean": round(float(points.mean()), 4),
            "point_std": round(float(points.std(ddof=1)), 4) if len(points) > 1 else None,
            "low_min": round(float(lows.min()), 4),
            "low_mean": round(float(lows.mean()), 4),
            "low_std": round(float(lows.std(ddof=1)), 4) if len(lows) > 1 else None,
            "margin_needed": round(float(-lows.min()), 4),
            "sabotaged_high_max": round(max(highs_bad), 4) if highs_bad else None,
        }
    out["equal_passed"] = sum(r["verdict"] == "pass" for r in equal)
    out["sabotaged_rejected"] = sum(b["exit"] == 1 for b in bad)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=Path("/tmp/cascade-walkthrough"))
    parser.add_argument("--train-seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--retrain-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--no-sabotage", dest="sabotage", action="store_false")
    parser.add_argument("--rate", type=float, default=30)
    parser.add_argument("--duration", type=float, default=300)
    parser.add_argument("--gate", type=Path, default=GATE)
    parser.add_argument(
        "--train-args", default="", help="extra options of train and retrain (epochs...)"
    )
    args = parser.parse_args()
    started = time.perf_counter()
    walks = []
    for seed in args.train_seeds:
        folder = args.folder / f"seed{seed}"
        if folder.exists():
            raise SystemExit(f"{folder} exists: choose another --folder")
        walks.append(walkthrough(folder, seed, args))
    summary = summarise(walks)
    for metric, m in summary["metrics"].items():
        print(
            f"{metric}: equal lower bounds min {m['low_min']:+.3f} mean {m['low_mean']:+.3f} "
            f"(point {m['point_mean']:+.3f} +- {m['point_std']}); sabotaged upper bound max "
            f"{m['sabotaged_high_max']}",
            flush=True,
        )
    record = {
        "gate": str(args.gate.relative_to(REPO) if args.gate.is_relative_to(REPO) else args.gate),
        "duration_s": args.duration,
        "rate": args.rate,
        "train_args": args.train_args,
        "load": os.getloadavg()[0],
        "seconds": round(time.perf_counter() - started, 1),
        "walks": walks,
        **summary,
    }
    line = {k: v for k, v in record.items() if k != "walks"}
    publish("walkthrough", record, line)


if __name__ == "__main__":
    main()
