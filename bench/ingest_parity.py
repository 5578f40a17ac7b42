"""Benchmark: MovieLens-100K through ``--data`` (a foreign format) against the native path.

Writes MovieLens-100K (read from the recbole wheel at run time: its license forbids shipping
the files) the way another team might keep it: gzipped CSV parts of ratings with string ids
("user-17", "film-0042"), other column names, ISO 8601 times, genres joined by ";", and a
dataset file with the rating rule ``{column: stars, positive_at: 4, neutral_at: 3}``. Then it
trains the native path (``--dataset movielens``) and the ``--data`` path with the same seed
and config through ``run_pipeline`` (no export) and compares the test NDCG@10 of the
two-tower and the test AUC of the ranking blend. It also checks that both paths feed the
models the same rows (same ids, times and positive classes, in the same order).

Run per seed; the seed-to-seed spread of the native path is the noise the differences are
judged against. Prints a line per run and, last, one JSON object (also written to
``bench/results/ingest_parity.json``).

    python bench/ingest_parity.py [--seeds 0,1] [--workdir /tmp/cascade-ingest-parity]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipelines.config import TrainConfig
from pipelines.data.ingest import load_ingested
from pipelines.data.movielens import load_movielens_100k
from pipelines.data.schema import RawDataset
from pipelines.pipeline import DATA_DIRECTORY, run_pipeline

STEPS = ("prepare", "retrieval", "ranking")
PARTS = 4  # ratings files
DATASET_FILE = """\
# MovieLens-100K in a foreign format, written by bench/ingest_parity.py
name: ml-100k-foreign
interactions:
  path: ratings/                  # ratings/part-0.csv.gz ... part-3.csv.gz
  user: member
  item: film
  timestamp: rated_at             # ISO 8601
  rating: {column: stars, positive_at: 4, neutral_at: 3}
users:
  path: members.csv
  key: member
  features:                       # MovieLens's own declaration (core/features/schema.py)
    sex: categorical
    age_years: numeric
    job: {kind: categorical, target_encode: true}
    postcode: {kind: categorical, min_frequency: 2}
items:
  path: films.csv
  key: film
  features:
    released: {kind: numeric, item_age: true}
    categories: {kind: multi_categorical, separator: ";"}
"""


def user_key(user_id: np.ndarray) -> list[str]:
    return [f"user-{u}" for u in user_id]


def item_key(item_id: np.ndarray) -> list[str]:
    return [f"film-{i:04d}" for i in item_id]


def write_foreign(raw: RawDataset, directory: Path, shuffle: int | None = None) -> Path:
    """Write ``raw`` (MovieLens-100K) in the foreign format into ``directory``; the dataset
    file's path. Tables are written in id order and ratings in file order, so the string ids
    get internal ids in the native order (first seen, table rows first); ``shuffle`` (a
    seed) writes every file's rows in a random order instead."""
    directory.mkdir(parents=True, exist_ok=True)
    if shuffle is not None:
        rng = np.random.default_rng(shuffle)
        raw = RawDataset(
            raw.name,
            raw.users.sample(frac=1.0, random_state=rng),
            raw.items.sample(frac=1.0, random_state=rng),
            raw.interactions.sample(frac=1.0, random_state=rng),
        )
    users = raw.users
    pd.DataFrame(
        {
            "member": user_key(users["user_id"].to_numpy()),
            "sex": users["gender"],
            "job": users["occupation"],
            "age_years": users["age"],
            "postcode": users["zip_code"],
        }
    ).to_csv(directory / "members.csv", index=False)
    items = raw.items
    pd.DataFrame(
        {
            "film": item_key(items["item_id"].to_numpy()),
            "name": items["title"],
            "released": items["year"].map(lambda y: "" if np.isnan(y) else f"{int(y)}"),
            "categories": items["genres"].str.replace("|", ";", regex=False),
        }
    ).to_csv(directory / "films.csv", index=False)
    ratings = raw.interactions
    stamps = pd.to_datetime(ratings["timestamp"], unit="s", utc=True)
    foreign = pd.DataFrame(
        {
            "rated_at": stamps.dt.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "film": item_key(ratings["item_id"].to_numpy()),
            "member": user_key(ratings["user_id"].to_numpy()),
            "stars": ratings["rating"].astype(int),
        }
    )
    (directory / "ratings").mkdir(exist_ok=True)
    for part, rows in enumerate(np.array_split(np.arange(len(foreign)), PARTS)):
        foreign.iloc[rows].to_csv(directory / "ratings" / f"part-{part}.csv.gz", index=False)
    path = directory / "dataset.yaml"
    path.write_text(DATASET_FILE)
    return path


def same_rows(native: RawDataset, data: RawDataset) -> dict[str, bool]:
    """Whether the two paths give the models the same rows: ids, times, and the class each
    rating falls in (positive >= 4, retrieval-only 3, negative)."""

    def classes(rating: pd.Series) -> np.ndarray:
        r = rating.to_numpy()
        return np.select([r >= 4, r >= 3], [2, 1], 0)

    a, b = native.interactions, data.interactions
    same = len(a) == len(b)
    out = {
        column: bool(same and np.array_equal(a[column].to_numpy(), b[column].to_numpy()))
        for column in ("user_id", "item_id", "timestamp")
    }
    out["rating_class"] = bool(same and np.array_equal(classes(a["rating"]), classes(b["rating"])))
    out["users"] = len(native.users) == len(data.users)
    out["items"] = len(native.items) == len(data.items)
    return out


def _metrics(report: Path | None) -> dict[str, float]:
    assert report is not None, "the pipeline wrote no report"
    summary = json.loads(report.read_text())
    return {
        "ndcg@10": summary["retrieval"]["metrics"]["two_tower"]["ndcg@10"],
        "auc": summary["ranking"]["metrics"]["blend"]["auc"],
    }


def _train(
    workdir: Path, dataset: str, config: TrainConfig, log: Any
) -> tuple[dict[str, float], float]:
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    started = time.perf_counter()
    report = run_pipeline(workdir, workdir / "export", config, STEPS, dataset, log=log)
    return _metrics(report), round(time.perf_counter() - started, 1)


def parity(
    workdir: Path,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
    verbose: bool = False,
    shuffle: int | None = None,
) -> dict[str, Any]:
    """Train MovieLens-100K natively and through ``--data`` with ``seed`` (and the same
    ``TrainConfig`` ``overrides``) under ``workdir``; both paths' test NDCG@10 (two-tower)
    and AUC (ranking blend), the differences (data - native) and whether the rows agree.
    ``shuffle`` (a seed): the foreign files' rows in a random order (``write_foreign``)."""
    workdir = Path(workdir)
    config = TrainConfig(seed=seed, **(overrides or {}))
    log = (lambda line: print(line, file=sys.stderr)) if verbose else (lambda line: None)
    raw = load_movielens_100k()
    dataset_file = write_foreign(raw, workdir / "foreign", shuffle)
    native, native_s = _train(workdir / f"native-s{seed}", "movielens", config, log)
    data_dir = workdir / f"data-s{seed}"
    data, data_s = _train(data_dir, str(dataset_file), config, log)
    rows = same_rows(raw, load_ingested(data_dir / DATA_DIRECTORY))
    return {
        "seed": seed,
        "native": native,
        "data": data,
        "difference": {k: round(data[k] - native[k], 6) for k in native},
        "same_rows": rows,
        "seconds": {"native": native_s, "data": data_s},
        "overrides": overrides or {},
        "shuffle": shuffle,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description="MovieLens-100K: native path against --data (a foreign-format copy).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds, one run each")
    parser.add_argument(
        "--workdir", type=Path, default=Path("/tmp/cascade-ingest-parity"), help="scratch"
    )
    parser.add_argument("--verbose", action="store_true", help="print the pipelines' logs")
    parser.add_argument(
        "--shuffle",
        type=int,
        default=None,
        help="write the foreign files' rows in a random order from this seed (default: "
        "native order)",
    )
    args = parser.parse_args()
    from publish import publish  # bench/ is on the path when run as a script

    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        run = parity(args.workdir, seed, verbose=args.verbose, shuffle=args.shuffle)
        print(
            f"seed {seed}: native {run['native']}  data {run['data']}  "
            f"difference {run['difference']}  same rows {all(run['same_rows'].values())}",
            flush=True,
        )
        runs.append(run)
    native = {k: [r["native"][k] for r in runs] for k in ("ndcg@10", "auc")}
    noise = {k: round(float(np.ptp(v)), 6) for k, v in native.items()}
    worst = {k: max(abs(r["difference"][k]) for r in runs) for k in noise}
    record = {
        "runs": runs,
        "native_seed_spread": noise,
        "largest_difference": worst,
        "within_noise": all(worst[k] <= noise[k] for k in noise) if len(runs) > 1 else None,
    }
    publish("ingest_parity", record)


if __name__ == "__main__":
    main()
