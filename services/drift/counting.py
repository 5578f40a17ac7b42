"""Drift statistics and serving KPIs of the served versions, exported to Prometheus.

On the request path (both hooks are vectorised, a few tens of microseconds, and never raise):

- ``observe_scored`` (called by the scoring stage once the ranker answered): the user-side
  quantities of the request (one value each), and ``item_sample`` randomly sampled scored
  candidates' item-side quantities, retrieval and ranking scores, read from the ranker's own
  input rows (``core.export.drift_reference`` defines the quantities);
- ``observe_served`` (called by the gateway with the final answer): catalog coverage and the
  popularity percentile of what was shown.

Off the request path, a background task every ``export_interval_s``: loads the reference of
each newly served version (``releases/<v>/drift_reference.json``, checked against the
manifest's sha256, read in a thread), drops retired versions and their series, and sets
``cascade_drift_psi`` / ``cascade_drift_js_distance`` / ``cascade_drift_samples``
{model_version, feature}, ``cascade_catalog_coverage_ratio`` and
``cascade_served_popularity_mean`` {model_version}. A version exported before drift
references existed serves as usual; its drift is not exported (logged once).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from prometheus_client import Gauge

from core.errors import ArtifactError
from core.export.drift_reference import (
    REFERENCE_FILE,
    Extractor,
    Reference,
    read_reference,
)
from core.export.verify import file_sha256, manifest_files
from services.drift.window import QuantityStats, VersionWindow
from services.metrics import (
    CATALOG_COVERAGE,
    DRIFT_JS,
    DRIFT_PSI,
    DRIFT_REFERENCE,
    DRIFT_SAMPLES,
    DRIFT_WINDOW,
    SERVED_POPULARITY,
    multiprocess_dir,
    version_label,
)
from services.serving.context import RequestContext
from services.serving.release import Release
from services.settings import DriftSettings
from services.util.background import BackgroundTask

log = logging.getLogger(__name__)


def popularity_percentiles(counts: np.ndarray) -> np.ndarray:
    """Popularity percentile of each count in 0..1: its mid-rank among all counts (ties share
    the mean of their ranks) / (n - 1); the least popular item is 0, the most popular 1."""
    counts = np.asarray(counts, np.float64)
    if len(counts) == 0:
        return np.zeros(0)
    ordered = np.sort(counts)
    below = np.searchsorted(ordered, counts, "left")
    equal = np.searchsorted(ordered, counts, "right") - below
    return (below + (equal - 1) / 2) / max(len(counts) - 1, 1)


def load_reference(root: Path, release: Release) -> dict[str, Reference] | None:
    """The version's references, checked against its manifest; None when the version has
    none (exported before drift references). Raises ``ArtifactError`` for a corrupted file
    or one its manifest does not list."""
    version = release.version
    name = f"releases/{version}/{REFERENCE_FILE}"
    path = root / name
    table = manifest_files(root, version)
    if not path.is_file():
        if table is not None and name in table:
            raise ArtifactError(f"{path} is listed in the manifest but missing")
        return None
    if table is not None:
        if name not in table:
            raise ArtifactError(f"{path} is not in the version's manifest (never served)")
        if file_sha256(path) != table[name]:
            raise ArtifactError(f"{path} is corrupted: sha256 differs from the manifest")
    return read_reference(path)


def catalog_percentiles(root: Path, release: Release) -> np.ndarray:
    """Popularity percentile of every catalog position, from the release's training counts."""
    popular = json.loads((root / "releases" / str(release.version) / "popularity.json").read_text())
    counts = np.zeros(len(release.item_ids))
    positions = release.positions(np.asarray(popular["item_ids"], np.int64))
    found = positions >= 0
    counts[positions[found]] = np.asarray(popular["counts"], np.float64)[found]
    return popularity_percentiles(counts)


class DriftMonitor:
    """Per-version windows of one gateway, their hooks and their exporter."""

    def __init__(
        self,
        settings: DriftSettings,
        root: Path,
        releases: Callable[[], dict[int, Release]],
        clock: Callable[[], float] = time.time,
        seed: int | None = None,
    ) -> None:
        self.settings = settings
        self.root = root
        self.releases = releases
        self.clock = clock
        self.rng = np.random.default_rng(seed)
        self.windows: dict[int, VersionWindow] = {}
        self.extractors: dict[int, Extractor] = {}  # per version: its schema's quantities
        self.without: set[int] = set()  # served versions with no (usable) reference
        self.exported: dict[str, set[str]] = {}  # model_version label -> features with series
        self.failed = False
        self._task = BackgroundTask()

    @property
    def slot_s(self) -> float:
        return self.settings.window_s / self.settings.sub_windows

    def _build(self, release: Release) -> VersionWindow | None:
        references = load_reference(self.root, release)
        if references is None:
            return None
        return VersionWindow(
            references,
            catalog_percentiles(self.root, release),
            int(release.manifest["config"]["history_length"]),
            self.settings.sub_windows,
            self.slot_s,
        )

    async def sync(self) -> None:
        """Load the windows of newly served versions (in a thread), drop retired ones."""
        served = self.releases()
        for version in [v for v in self.windows if v not in served]:
            del self.windows[version]
            self.extractors.pop(version, None)
        self.without &= set(served)
        for version, release in list(served.items()):
            if version in self.windows or version in self.without:
                continue
            try:
                window = await asyncio.to_thread(self._build, release)
            except (ArtifactError, OSError, ValueError, KeyError) as error:
                log.error(
                    "version %d: drift reference refused, drift not exported: %s", version, error
                )
                window = None
            if window is None:
                if version not in self.without:
                    log.warning(
                        "version %d has no %s: its drift is not exported", version, REFERENCE_FILE
                    )
                self.without.add(version)
                continue
            self.windows[version] = window
            self.extractors[version] = Extractor(release.workflow.schema)

    def observe_scored(
        self, ctx: RequestContext, sparse: np.ndarray, dense: np.ndarray, scores: np.ndarray
    ) -> None:
        """Count one scored request (the ranker's input rows and the blended probabilities)."""
        window = self.windows.get(ctx.model_version)
        if window is None or len(sparse) == 0:
            return
        try:
            history = len(ctx.user.recent) if ctx.user is not None else 0
            extract = self.extractors[ctx.model_version]
            user = extract.user_values(sparse[0], dense[0], min(history, window.history_length))
            rows = self.rng.integers(0, len(sparse), min(self.settings.item_sample, len(sparse)))
            items = extract.item_values(
                sparse[rows], dense[rows], ctx.retrieval_scores[rows], scores[rows]
            )
            window.add(user, items, self.clock())
        except Exception:  # never fail a request for a statistic
            self._failed_once()

    def observe_served(self, ctx: RequestContext) -> None:
        """Count the items of one answer (coverage and popularity of what is served)."""
        window = self.windows.get(ctx.model_version)
        if window is None or len(ctx.candidates) == 0:
            return
        try:
            window.add_served(ctx.candidates, self.clock())
        except Exception:
            self._failed_once()

    def _failed_once(self) -> None:
        if not self.failed:
            log.exception("drift counting failed; requests are served as usual")
        self.failed = True

    def snapshot(self) -> dict[int, dict[str, QuantityStats]]:
        """PSI, JS distance and samples per served version with a reference, per quantity."""
        now = self.clock()
        return {version: window.stats(now) for version, window in self.windows.items()}

    def export(self) -> None:
        """Set every drift and KPI gauge from the windows; remove series of retired versions."""
        now = self.clock()
        served = self.releases()
        labels: dict[str, set[str]] = {}
        DRIFT_WINDOW.set(self.settings.window_s)
        for version, window in self.windows.items():
            label = version_label(version, served)
            labels[label] = set()
            DRIFT_REFERENCE.labels(model_version=label).set(1)
            for feature, stats in window.stats(now).items():
                labels[label].add(feature)
                DRIFT_SAMPLES.labels(model_version=label, feature=feature).set(stats.samples)
                for gauge, value in ((DRIFT_PSI, stats.psi), (DRIFT_JS, stats.js_distance)):
                    if math.isnan(value):  # no samples: no value rather than a fake 0
                        _remove(gauge, label, feature)
                    else:
                        gauge.labels(model_version=label, feature=feature).set(value)
            CATALOG_COVERAGE.labels(model_version=label).set(window.coverage(now))
            popularity = window.popularity_mean(now)
            if popularity is None:
                _remove(SERVED_POPULARITY, label)
            else:
                SERVED_POPULARITY.labels(model_version=label).set(popularity)
        self._unexport(labels)

    def _unexport(self, keep: dict[str, set[str]]) -> None:
        """Remove the series exported before that ``keep`` (label -> features) does not hold;
        ``keep`` is what is exported from now on."""
        for label, features in self.exported.items():
            if label not in keep:
                for gauge in (DRIFT_REFERENCE, CATALOG_COVERAGE, SERVED_POPULARITY):
                    _remove(gauge, label)
            for feature in features - keep.get(label, set()):
                for gauge in (DRIFT_PSI, DRIFT_JS, DRIFT_SAMPLES):
                    _remove(gauge, label, feature)
        self.exported = keep

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.export_interval_s)
            try:
                await self.sync()
                self.export()
            except Exception:
                log.exception(
                    "drift export failed; retrying in %.0f s", self.settings.export_interval_s
                )

    async def start(self) -> None:
        """Load the served versions' references, export once, then every interval."""
        if not self.settings.enabled:
            return
        await self.sync()
        self.export()
        self._task.start(self._loop())

    async def close(self) -> None:
        """Stop exporting and remove this monitor's series: a closed gateway's windows must
        not stay on the process's /metrics (another gateway in the process would show them)."""
        await self._task.stop()
        self._unexport({})


def _remove(gauge: Gauge, *labels: str) -> None:
    """Drop a series; in multiprocess mode (which cannot remove one) set it to NaN instead,
    which no alert condition holds for and the worker's next exports keep."""
    if multiprocess_dir() is not None:
        gauge.labels(*labels).set(math.nan)
        return
    with contextlib.suppress(KeyError):  # never set: nothing to remove
        gauge.remove(*labels)
