"""The offline pipeline end to end: data -> prepare -> retrieval -> ranking -> export -> report.

Each step reads what the previous one wrote into the work directory, so steps can also be
run one at a time (``cascade train prepare``, ``cascade train retrieval``, ...).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from core.errors import ArtifactError, ConfigError, UsageError
from pipelines.config import BUILT_IN, STEPS, TrainConfig
from pipelines.data.dataset_file import load_dataset_file
from pipelines.data.ingest import ingest, load_ingested
from pipelines.data.movielens import load_movielens_100k
from pipelines.data.schema import RawDataset, oldest
from pipelines.data.synthetic import make_synthetic
from pipelines.evaluation.popularity_check import enforce, recorded_checks, with_override
from pipelines.evaluation.report import write_report
from pipelines.export.exporter import run_export
from pipelines.prepare import prepare
from pipelines.prepare_streaming import describe, ingested_rows, prepare_ingested
from pipelines.split import (
    PERMUTATION,
    SPLIT_METHOD,
    Split,
    hashed_split,
    per_user_split,
    random_split,
    row_draws,
)
from pipelines.training.ranking import run_ranking
from pipelines.training.retrieval import run_retrieval

DATASET_INFO = "dataset.json"
DATA_DIRECTORY = "data"  # a dataset file's data, converted (pipelines/data/ingest.py)
STREAMING_ROWS = 20_000_000  # --streaming-prepare auto: stream above this many interactions


def load_dataset(
    name: str,
    seed: int,
    synthetic_size: tuple[int, int, int],
    workdir: Path | None = None,
    log: Callable[[str], None] | None = None,
) -> RawDataset:
    """A built-in data set by name (``movielens``, ``synthetic``), or a team's own data by
    the path of its dataset file (read and checked into ``workdir``/data first, with the
    conversion's progress lines to ``log``)."""
    if name == BUILT_IN[0]:
        return load_movielens_100k()
    if name == BUILT_IN[1]:
        users, items, interactions = synthetic_size
        return make_synthetic(users, items, interactions, seed=seed)
    if _is_data_file(name):
        return load_data_file(Path(name), workdir or Path("artifacts/work"), log)
    raise ConfigError(
        f"unknown dataset {name!r}; choose movielens or synthetic, or give a dataset file "
        "(--data dataset.yaml)"
    )


def ingest_data_file(path: Path, workdir: Path, log: Callable[[str], None] | None = None) -> Path:
    """Check and convert a team's data (its dataset file: docs/your-data.md) into
    ``workdir/data`` and return that directory, with progress lines to ``log``. Bad data
    fails before anything is replaced."""
    dataset = load_dataset_file(path)
    target, fresh = workdir / DATA_DIRECTORY, workdir / f"{DATA_DIRECTORY}.next"
    shutil.rmtree(fresh, ignore_errors=True)
    ingest(dataset, fresh, log)
    shutil.rmtree(target, ignore_errors=True)
    fresh.rename(target)
    return target


def load_data_file(
    path: Path, workdir: Path, log: Callable[[str], None] | None = None
) -> RawDataset:
    """A team's data, checked and converted (``ingest_data_file``), in memory."""
    return load_ingested(ingest_data_file(path, workdir, log))


def _is_data_file(name: str) -> bool:
    return name not in BUILT_IN and (name.endswith((".yaml", ".yml")) or Path(name).is_file())


def streams(config: TrainConfig, base_fraction: float, rows: int) -> bool:
    """Whether the prepare step of ingested data of ``rows`` interactions streams."""
    if config.streaming_prepare == "on":
        return True
    allowed = (
        config.split_protocol == "global"
        and config.fit_workers is None
        and config.dask_scheduler is None
        and base_fraction >= 1
    )
    return config.streaming_prepare == "auto" and allowed and rows > STREAMING_ROWS


def _source(dataset: str) -> str:
    """What the data came from: a built-in name, or the dataset file's absolute path (so
    `cascade retrain` reads the same data)."""
    return dataset if dataset in BUILT_IN else str(Path(dataset).resolve())


def split_for(raw: RawDataset, config: TrainConfig, method: str = SPLIT_METHOD) -> Split:
    """The split of ``config.split_protocol``; ``method`` ``PERMUTATION`` is the one of
    versions exported before ``SPLIT_METHOD`` (their manifests record no method)."""
    if method not in (SPLIT_METHOD, PERMUTATION):
        raise ConfigError(f"unknown split method {method!r}")
    rows = raw.interactions
    hashed = method == SPLIT_METHOD
    if config.split_protocol == "per_user":
        draws = row_draws(rows, config.seed) if hashed else None
        return per_user_split(rows["user_id"].to_numpy(), config.seed, draws=draws)
    if hashed:
        return hashed_split(rows, config.seed)
    return random_split(len(rows), config.seed)


def _prepare(
    dataset: str,
    workdir: Path,
    config: TrainConfig,
    synthetic_size: tuple[int, int, int],
    base_fraction: float,
    log: Callable[[str], None],
) -> dict:
    """The prepare step; returns what ``dataset.json`` records of the data."""
    if _is_data_file(dataset):
        directory = ingest_data_file(Path(dataset), workdir, log)
        if streams(config, base_fraction, ingested_rows(directory)):
            described = describe(directory)
            log(
                f"{described.name}: {described.users} users, {described.items} items, "
                f"{described.interactions} interactions (prepared a partition at a time)"
            )
            prepare_ingested(directory, workdir, config.seed, config.history_length, log=log)
            return {
                "dataset": described.name,
                "newest_timestamp": described.newest_timestamp,
                "data_hash": described.data_hash,
            }
        full = load_ingested(directory)
    else:
        full = load_dataset(dataset, config.seed, synthetic_size, workdir)
    raw = oldest(full, base_fraction)
    log(
        f"{raw.name}: {len(raw.users)} users, {len(raw.items)} items, "
        f"{len(raw.interactions)} interactions"
    )
    prepare(
        raw,
        workdir,
        seed=config.seed,
        history_length=config.history_length,
        split=split_for(raw, config),
        fit_workers=config.fit_workers,
        dask_scheduler=config.dask_scheduler,
    )
    return {
        "dataset": raw.name,
        # the time watermark of what this version learnt: a retrain on logs that grew
        # since treats newer rows as new (control/retrain/job.py)
        "newest_timestamp": int(raw.interactions["timestamp"].max()),
        "data_hash": raw.content_hash(),
    }


def quality_checks(workdir: Path) -> list[dict]:
    """The beats-popularity checks the training steps recorded (those present)."""
    return recorded_checks({}, workdir)


def _read_json(path: Path, produced_by: str) -> dict:
    if not path.is_file():
        raise ArtifactError(f"{path} is missing: run `cascade train {produced_by}` first")
    return json.loads(path.read_text())


def run_pipeline(
    workdir: Path,
    output: Path,
    config: TrainConfig,
    steps: tuple[str, ...] = STEPS,
    dataset: str = "movielens",
    synthetic_size: tuple[int, int, int] = (10_000, 5_000, 200_000),
    log: Callable[[str], None] = print,
    base_fraction: float = 1.0,
) -> Path | None:
    """Run ``steps`` in order; write the report and return its path (None when the steps run
    so far leave the retrieval or ranking results missing).

    ``base_fraction`` < 1 trains on the oldest part of the data set only (recorded in the
    manifest, so ``cascade retrain`` knows the newer rows are new to this version)."""
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        raise ConfigError(f"unknown steps {unknown}; choose from {list(STEPS)}")
    if not 0 < base_fraction <= 1:
        raise ConfigError(f"--base-fraction must be in (0, 1], got {base_fraction}")
    if config.streaming_prepare == "on" and base_fraction < 1:
        raise UsageError(
            "--streaming-prepare on trains on all rows: drop --base-fraction, or use "
            "--streaming-prepare off"
        )
    timings: dict[str, float] = {}
    for step in STEPS:
        if step not in steps:
            continue
        started = time.perf_counter()
        log(f"== {step}")
        if step == "prepare":
            info = _prepare(dataset, workdir, config, synthetic_size, base_fraction, log)
            (workdir / DATASET_INFO).write_text(
                json.dumps(
                    {
                        **info,
                        "source": _source(dataset),
                        "split_protocol": config.split_protocol,
                        "split_method": SPLIT_METHOD,
                        "base_fraction": base_fraction,
                    }
                )
            )
        elif step == "retrieval":
            run_retrieval(workdir, config, log)
            enforce(with_override(quality_checks(workdir), config.allow_below_popularity))
        elif step == "ranking":
            run_ranking(workdir, config, log)
            enforce(with_override(quality_checks(workdir), config.allow_below_popularity))
        elif step == "export":
            info = _read_json(workdir / DATASET_INFO, "prepare")
            metrics = {
                "retrieval": _read_json(workdir / "retrieval_result.json", "retrieval")["metrics"],
                "ranking": _read_json(workdir / "ranking_result.json", "ranking")["metrics"],
            }
            checks = with_override(quality_checks(workdir), config.allow_below_popularity)
            enforce(checks)  # the export step run on its own is blocked too
            manifest = run_export(
                workdir, output, config, {**info, "metrics": metrics, "quality_checks": checks}
            )
            log(f"exported {manifest.parent}")
        timings[step] = round(time.perf_counter() - started, 2)
    missing = [s for s in ("retrieval", "ranking") if not (workdir / f"{s}_result.json").is_file()]
    if missing:  # a partial run (say `prepare retrieval`): its results are saved, no report yet
        log(f"report: not written until `cascade train {' '.join(missing)}` has run")
        return None
    info = _read_json(workdir / DATASET_INFO, "prepare")
    retrieval = _read_json(workdir / "retrieval_result.json", "retrieval")
    ranking = _read_json(workdir / "ranking_result.json", "ranking")
    return write_report(workdir / "report", retrieval, ranking, {**info, "step_seconds": timings})
