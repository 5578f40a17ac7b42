"""The retrain job, phase by phase, under one lock.

lock -> recover what a killed run left -> production (adopt the served version on a first
deploy) -> snapshot the streams after the cursor -> base + logged rows, split (the newest
window minus what production learnt is the holdout) ->
prepare -> two-tower -> DLRM + trees -> export -> gate -> ``validation.json`` -> register
-> commit the cursor -> optional garbage collection.

A crash anywhere leaves either a registered version with its artifacts and verdict, or
nothing the next run does not remove (see ``control.retrain.state``). No warm start: every
run refits the feature workflow on the new data, so categorical ids change meaning between
versions and production's weights do not line up with the new tables.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from control.retrain.dataset import Learnt, combine, oldest, oldest_rows
from control.retrain.evidence import logged_rows, unvouched_check
from control.retrain.snapshot import Snapshot, read_since, read_snapshots, write_snapshot
from control.retrain.state import STREAM_NAMES, StateDir, recover, remove_version
from control.validation.config import load_gate_config
from control.validation.gate import run_gate
from control.validation.verdict import Verdict, table, write_verdict
from core.errors import ConfigError, UsageError
from core.export.repository import next_version
from pipelines.config import TrainConfig
from pipelines.data.schema import RawDataset
from pipelines.export.exporter import run_export
from pipelines.pipeline import DATASET_INFO, load_dataset, split_for
from pipelines.prepare import prepare
from pipelines.split import PERMUTATION, SPLIT_METHOD
from pipelines.training.ranking import run_ranking
from pipelines.training.retrieval import run_retrieval

LOCK_NAME = "retrain"
SABOTAGES = ("shuffled-embeddings",)


LOCK_TTL_S = 30.0  # a killed job blocks the next one this long (a heartbeat renews it)


class Lock(Protocol):
    def check(self) -> Any: ...


class Registry(Protocol):
    """What the job needs of ``control.registry.Registry``."""

    def register(self, version: int, verdict: dict[str, Any]) -> Any: ...
    def production(self) -> int | None: ...
    def get(self, version: int) -> Any: ...
    def lock(self, name: str, ttl_s: float) -> AbstractContextManager[Any]: ...


@dataclass
class RetrainOptions:
    artifacts: Path
    config: TrainConfig = field(default_factory=TrainConfig)
    state_dir: Path | None = None  # default: <artifacts>/retrain
    dataset: str | None = None  # None: what production was trained on (production_source)
    synthetic_size: tuple[int, int, int] = (10_000, 5_000, 200_000)
    base_fraction: float = 1.0
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
    gate_config: Path | None = None
    force: bool = False
    sabotage: str | None = None
    gc_keep: int | None = None
    lock_ttl_s: float = LOCK_TTL_S
    trigger: dict[str, Any] | None = None  # why it runs (the alerts of a queued request)


@dataclass
class Outcome:
    version: int
    verdict: Verdict
    seconds: float

    @property
    def exit_code(self) -> int:
        return 0 if self.verdict.passed or self.verdict.forced else 1


class Progress:
    """One line per phase or epoch, with the elapsed time; stops the job (``LockLost``)
    once its lock was taken by another run (the lock's heartbeat keeps it alive)."""

    def __init__(self, log: Callable[[str], None], check_lock: Callable[[], Any]) -> None:
        self.log, self.check_lock = log, check_lock
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        self.check_lock()
        self.log(f"[retrain {time.monotonic() - self.started:7.1f}s] {message}")


def _run_name() -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"p{os.getpid()}"


def production_source(root: Path, production: int | None) -> str:
    """The data ``production`` was trained on, as its manifest records it (``source``: a
    built-in name or a dataset file, whose logs may have grown since); else movielens."""
    path = root / "releases" / str(production) / "manifest.json"
    manifest = json.loads(path.read_text()) if production is not None and path.is_file() else {}
    return str(manifest.get("source") or "movielens")


def production_learnt(
    root: Path, production: int | None, full_base: RawDataset, base_rows: np.ndarray
) -> Learnt:
    """What ``production`` learnt from, over the rows of the base data set in use
    (``base_rows``: their positions in ``full_base``).

    - a version made by ``cascade retrain`` recorded ``learnt_until``: every row up to it;
    - a version made by ``cascade train`` on the same data (its manifest's data hash; with
      ``--base-fraction``, on its oldest part) with a random split: that split,
      reconstructed from the recorded protocol, seed and split method (none recorded: the
      seeded permutation of versions exported before the hashed split); its training and
      validation rows count as learnt (validation chose its epochs and blend), newer rows
      are new to it;
    - a version whose data has changed since (a dataset file whose logs grew): every row up
      to the newest timestamp it was trained on (its manifest's ``newest_timestamp``);
    - anything else: the whole base data set (its newest timestamp).
    """
    if production is None:
        return Learnt()
    path = root / "releases" / str(production) / "manifest.json"
    manifest = json.loads(path.read_text()) if path.is_file() else {}
    until = manifest.get("training_data", {}).get("learnt_until")
    if until is not None:
        return Learnt(until=int(until), source=f"version {production}: rows up to {until}")
    config = manifest.get("config", {})
    protocol = manifest.get("split_protocol", config.get("split_protocol"))
    fraction = float(manifest.get("base_fraction", 1.0))
    # manifests from before the hashed split record no method: the seeded permutation
    method = manifest.get("split_method", PERMUTATION)
    trained = oldest(full_base, fraction) if 0 < fraction <= 1 else None
    if (
        trained is not None
        and manifest.get("data_hash") == trained.content_hash()
        and protocol in ("global", "per_user")
        and method in (SPLIT_METHOD, PERMUTATION)
        and isinstance(config.get("seed"), int)
    ):
        split = split_for(
            trained, TrainConfig(seed=config["seed"], split_protocol=protocol), method
        )
        positions = oldest_rows(full_base, fraction)  # trained's rows in full_base
        learnt = np.zeros(len(full_base.interactions), bool)
        learnt[positions[split.train]] = learnt[positions[split.valid]] = True
        of = f" of the oldest {fraction:g} of the data" if fraction < 1 else ""
        return Learnt(
            base_rows=learnt[base_rows],
            source=f"version {production}: its {protocol} random split{of}, seed "
            f"{config['seed']} ({method}), reconstructed",
        )
    trained_until = manifest.get("newest_timestamp")
    if trained_until is not None:  # the data changed since (new log files): a time watermark
        return Learnt(
            until=int(trained_until),
            source=f"version {production}: trained on data up to {int(trained_until)}; newer "
            "rows are new to it",
        )
    newest = int(full_base.interactions["timestamp"].max())
    return Learnt(
        until=newest,
        source=f"version {production}: its split is unknown, so all base data up to {newest}",
    )


def sabotage_embeddings(workdir: Path, seed: int) -> None:
    """Permute the item embeddings (rows no longer match their items) before the export
    builds the index from them: a candidate the gate must reject (demos and tests)."""
    path = workdir / "models" / "item_embeddings.npy"
    embeddings = np.load(path)
    np.save(path, embeddings[np.random.default_rng(seed).permutation(len(embeddings))])


def _snapshot(settings: Any, cursor: dict[str, str]) -> Snapshot:
    from services.serving.gateway import make_store

    async def read() -> Snapshot:
        streams = settings.embedded_streams()  # the embedded gateway's files (no Redis)
        store = make_store(settings.model_copy(update={"streams_dir": streams}))
        await store.start()
        try:
            return await read_since(store, cursor)
        finally:
            await store.close()

    return asyncio.run(read())


def run_retrain(
    options: RetrainOptions,
    settings: Any,
    registry: Registry,
    adopt_served: Callable[[], int | None],
    log: Callable[[str], None] = print,
) -> Outcome:
    """Run the job once (see the module docstring); raises on errors, after cleaning up."""
    if options.sabotage is not None and options.sabotage not in SABOTAGES:
        raise ConfigError(f"unknown sabotage {options.sabotage!r}; one of {list(SABOTAGES)}")
    if not 0 < options.base_fraction <= 1:
        raise ConfigError(f"--base-fraction must be in (0, 1], got {options.base_fraction}")
    if options.config.fit_workers is not None or options.config.dask_scheduler is not None:
        raise UsageError(
            "--fit-workers/--dask-scheduler: cascade retrain cannot fit on a Dask cluster: "
            "its holdout split chooses rows by time over the whole data set, and each "
            "worker sees only its own partition (docs/scaling-out.md)"
        )
    if options.config.streaming_prepare == "on":
        raise UsageError(
            "--streaming-prepare on: cascade retrain prepares in memory: its holdout split "
            "chooses rows by time over the whole data set"
        )
    gate_config = load_gate_config(options.gate_config)
    root = options.artifacts
    state_dir = StateDir(options.state_dir or root / "retrain")
    started = time.monotonic()
    with registry.lock(LOCK_NAME, options.lock_ttl_s) as lock:
        progress = Progress(log, lock.check)
        progress("lock taken; recovering what an earlier run left, if anything")
        recover(state_dir, root, lambda v: registry.get(v) is not None, progress)
        production = registry.production()
        if production is None:
            production = adopt_served()
            if production is not None:
                progress(f"no production version: adopted the served version {production}")
        progress(f"production version: {production if production is not None else 'none'}")

        state = state_dir.load()
        snapshot = _snapshot(settings, state.cursor)
        run = _run_name()
        paths = {s: state_dir.snapshot_path(run, s) for s in STREAM_NAMES}
        write_snapshot(snapshot, paths)
        journal: dict[str, Any] = {
            "run": run,
            "cursor": snapshot.cursor,
            "skipped": dict(snapshot.skipped),
            "started": time.time(),
            "after_version": None,
            "version": None,
            "trigger": options.trigger,
        }
        state_dir.write_journal(journal)
        if options.trigger is not None:
            progress(f"triggered by {json.dumps(options.trigger, sort_keys=True)}")
        skipped = ", ".join(f"{k} {v}" for k, v in sorted(snapshot.skipped.items())) or "none"
        progress(
            f"snapshot {run}: {len(snapshot.feedback)} feedback events, "
            f"{len(snapshot.impressions)} impression sets since {state.cursor}; skipped: {skipped}"
        )
        version: int | None = None
        registering = False
        try:
            runs = [*state.snapshots, run]
            feedback = read_snapshots(
                [state_dir.snapshot_path(r, "feedback") for r in runs], "feedback"
            )
            impressions = read_snapshots(
                [state_dir.snapshot_path(r, "impressions") for r in runs], "impressions"
            )
            config = options.config
            source = options.dataset or production_source(root, production)
            progress(f"base data: {source}")
            full_base = load_dataset(
                source, config.seed, options.synthetic_size, state_dir.work, progress
            )
            base = oldest(full_base, options.base_fraction)
            learnt = production_learnt(
                root, production, full_base, oldest_rows(full_base, options.base_fraction)
            )
            logged, left_out, evidence_notes = logged_rows(
                feedback, impressions, gate_config.logged_events
            )
            data = combine(base, logged, options.fractions, learnt, config.seed)
            data.dropped.update(left_out)
            dropped = ", ".join(f"{k} {v}" for k, v in sorted(data.dropped.items())) or "none"
            progress(
                f"data: {data.base_rows} base rows + {data.logged_rows} logged rows from "
                f"{len(runs)} snapshot(s) (dropped: {dropped}); split "
                f"{len(data.split.train)}/{len(data.split.valid)}/{len(data.split.test)}"
            )
            holdout_notes = [*data.holdout_notes(), *evidence_notes]
            for note in holdout_notes:
                progress(note)
            work = state_dir.work
            prepare(
                data.dataset,
                work,
                seed=config.seed,
                history_length=config.history_length,
                split=data.split,
            )
            info = {"dataset": data.dataset.name, "data_hash": data.data_hash, "source": source}
            (work / DATASET_INFO).write_text(json.dumps(info))
            progress("prepared; training the two-tower and BPR-MF")
            retrieval = run_retrieval(work, config, progress)
            progress("training DLRM and the trees")
            ranking = run_ranking(work, config, progress)
            if options.sabotage == "shuffled-embeddings":
                sabotage_embeddings(work, config.seed)
                progress("SABOTAGE: item embeddings permuted before the export (demo/test flag)")
            journal["after_version"] = next_version(root) - 1
            state_dir.write_journal(journal)
            manifest = run_export(
                work,
                root,
                config,
                {
                    **info,
                    # a sabotaged export is not the models these metrics measured: none shown
                    "metrics": {}
                    if options.sabotage
                    else {"retrieval": retrieval["metrics"], "ranking": ranking["metrics"]},
                    "training_data": {
                        "split": "holdout",
                        "fractions": list(options.fractions),
                        "learnt_until": data.learnt_until(),
                        "base_rows": data.base_rows,
                        "logged_rows": data.logged_rows,
                        "snapshots": runs,
                        "cursor": snapshot.cursor,
                        "warm_start": False,
                        "sabotage": options.sabotage,
                        "trigger": options.trigger,
                    },
                },
            )
            version = int(manifest.parent.name)
            journal["version"] = version
            state_dir.write_journal(journal)
            progress(f"exported version {version}; running the validation gate")
            verdict = run_gate(
                root,
                version,
                production,
                data.holdout(),
                gate_config,
                data.data_hash,
                notes=holdout_notes,
                workdir=work,
                train_config=config,
                report=progress,
            )
            verdict.checks.append(unvouched_check(data, gate_config.logged_events))
            verdict.forced = options.force and not verdict.passed
            if verdict.forced:
                verdict.notes.append("--force: registered as a candidate although the gate failed")
            write_verdict(manifest.parent, verdict)
            log(table(verdict))
            lock.check()  # a run that lost its lock registers nothing
            registering = True
            registry.register(version, verdict.as_dict())
        except BaseException:
            if not registering:  # nothing registered: remove what this run made
                if version is not None:
                    remove_version(root, version)
                state_dir.discard(journal)
            # while registering, the outcome is unknown: the next run's recovery asks the
            # registry and rolls forward or removes the version
            raise
        lock.check()
        state_dir.commit(journal)
        progress(
            f"registered version {version} as "
            f"{'candidate' if verdict.passed or verdict.forced else 'rejected'}; cursor committed"
        )
        if options.gc_keep is not None:
            from control.retention import collect_garbage

            collect_garbage(
                registry,  # type: ignore[arg-type]  # the real Registry (the CLI builds it)
                root,
                options.gc_keep,
                settings.embedding_cache.redis_url or settings.redis.url,
                settings.embedding_cache.namespace,
            )
            progress(f"garbage collected (keeping {options.gc_keep})")
    return Outcome(version, verdict, time.monotonic() - started)
