"""The gateway's drift monitor over a real export: reference checked against the manifest,
gauges equal to the window statistics, old versions served without drift (issue 11)."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import REGISTRY

from core.errors import ArtifactError
from core.export.drift_reference import QUANTITIES, REFERENCE_FILE
from services import metrics
from services.drift.counting import load_reference
from services.serving.gateway import Gateway
from services.serving.release import load_release
from services.settings import Settings


def _value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_export_writes_a_listed_reference_of_every_quantity(exported: Path) -> None:
    manifest = json.loads((exported / "releases" / "1" / "manifest.json").read_text())
    assert f"releases/1/{REFERENCE_FILE}" in manifest["files"]
    references = load_reference(exported, load_release(exported, 1))
    assert references is not None and set(references) == set(QUANTITIES)
    for reference in references.values():
        assert reference.proportions.sum() == pytest.approx(1.0)
        assert len(reference.edges) <= 9


def _copy(exported: Path, tmp_path: Path) -> Path:
    root = tmp_path / "export"
    shutil.copytree(exported, root, ignore=shutil.ignore_patterns("work"))
    return root


def test_a_corrupted_or_unlisted_reference_is_refused(exported: Path, tmp_path: Path) -> None:
    root = _copy(exported, tmp_path)
    release = load_release(root, 1)
    path = root / "releases" / "1" / REFERENCE_FILE
    path.write_text(path.read_text().replace("0.", "0.0", 1))
    with pytest.raises(ArtifactError, match=r"drift_reference\.json is corrupted"):
        load_reference(root, release)
    manifest_path = root / "releases" / "1" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["files"][f"releases/1/{REFERENCE_FILE}"]
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="not in the version's manifest"):
        load_reference(root, release)
    path.unlink()
    assert load_reference(root, release) is None  # an old version: no drift, no error


async def test_gauges_equal_the_window_statistics(exported: Path) -> None:
    # a generous scoring timeout: on a busy machine a timed-out (degraded, unscored) answer
    # is not counted, and the sample counts below would be one short
    gateway = Gateway(Settings(artifacts=exported, triton={"timeout_ms": 5000}))
    await gateway.start()
    try:
        users = np.random.default_rng(0).integers(1, 301, 60)
        for user in users:
            await gateway.recommend(int(user), 10, {}, [], None)
        await gateway.recommend(10_000_000, 10, {}, [], None)  # a cold start counts too
        gateway.drift.export()
        stats = gateway.drift.snapshot()[1]
        assert set(stats) == set(QUANTITIES)
        assert stats["user_age"].samples == 61
        assert stats["item_year"].samples == 61 * gateway.settings.drift.item_sample
        for feature, value in stats.items():
            labels = {"model_version": "1", "feature": feature}
            assert _value("cascade_drift_psi", **labels) == pytest.approx(value.psi, abs=1e-12)
            assert _value("cascade_drift_js_distance", **labels) == pytest.approx(
                value.js_distance, abs=1e-12
            )
            assert _value("cascade_drift_samples", **labels) == value.samples
            assert 0 <= value.js_distance <= 1 and value.psi >= 0
        coverage = _value("cascade_catalog_coverage_ratio", model_version="1")
        popularity = _value("cascade_served_popularity_mean", model_version="1")
        assert coverage is not None and 10 / 400 <= coverage <= 1
        assert popularity is not None and 0 < popularity < 1
        assert _value("cascade_drift_reference_info", model_version="1") == 1
    finally:
        await gateway.close()


async def test_a_version_without_reference_serves_without_drift(
    exported: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = _copy(exported, tmp_path)
    manifest_path = root / "releases" / "1" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["files"][f"releases/1/{REFERENCE_FILE}"]
    manifest_path.write_text(json.dumps(manifest))
    (root / "releases" / "1" / REFERENCE_FILE).unlink()
    gateway = Gateway(Settings(artifacts=root))
    with caplog.at_level(logging.WARNING, logger="services.drift.counting"):
        await gateway.start()
    try:
        ctx, _ = await gateway.recommend(3, 5, {}, [], None)
        assert len(ctx.candidates) == 5 and not ctx.degraded
        assert gateway.drift.windows == {} and gateway.drift.snapshot() == {}
        await gateway.drift.sync()  # warned once, not at every sync
        warnings = [r for r in caplog.records if REFERENCE_FILE in r.getMessage()]
        assert len(warnings) == 1 and "version 1 has no" in warnings[0].getMessage()
    finally:
        await gateway.close()


async def test_a_failing_counter_never_fails_a_request(
    exported: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway = Gateway(Settings(artifacts=exported))
    await gateway.start()
    try:
        window = gateway.drift.windows[1]

        def broken(*_: object, **__: object) -> None:
            raise RuntimeError("counting bug")

        monkeypatch.setattr(window, "add", broken)
        monkeypatch.setattr(window, "add_served", broken)
        ctx, _ = await gateway.recommend(3, 5, {}, [], None)
        assert len(ctx.candidates) == 5 and not ctx.degraded
        assert gateway.drift.failed
    finally:
        await gateway.close()


async def test_retired_versions_lose_their_series(exported: Path) -> None:
    gateway = Gateway(Settings(artifacts=exported))
    await gateway.start()
    try:
        await gateway.recommend(3, 5, {}, [], None)
        gateway.drift.export()
        assert _value("cascade_drift_samples", model_version="1", feature="user_age") is not None
        gateway.releases.pop(1)  # what the state follower does when it retires a version
        await gateway.drift.sync()
        gateway.drift.export()
        assert _value("cascade_drift_samples", model_version="1", feature="user_age") is None
        assert _value("cascade_catalog_coverage_ratio", model_version="1") is None
    finally:
        await gateway.close()


async def test_a_closed_gateway_leaves_no_drift_series(exported: Path) -> None:
    """Several gateways may share a process (tests, benchmarks): one that closed must not
    leave its windows on /metrics for the next one to show."""
    gateway = Gateway(Settings(artifacts=exported))
    await gateway.start()
    await gateway.recommend(3, 5, {}, [], None)
    gateway.drift.export()
    assert _value("cascade_drift_samples", model_version="1", feature="user_age") is not None
    await gateway.close()
    assert _value("cascade_drift_samples", model_version="1", feature="user_age") is None
    assert _value("cascade_drift_reference_info", model_version="1") is None


async def test_with_worker_processes_retired_series_become_nan(
    exported: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Multiprocess mode cannot remove a series (each worker's file keeps it): the retired
    version's values become NaN, which no alert condition holds for."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    gateway = Gateway(Settings(artifacts=exported))
    await gateway.start()
    try:
        await gateway.recommend(3, 5, {}, [], None)
        gateway.drift.export()
        gateway.releases.pop(1)
        await gateway.drift.sync()
        gateway.drift.export()
        samples = _value("cascade_drift_samples", model_version="1", feature="user_age")
        coverage = _value("cascade_catalog_coverage_ratio", model_version="1")
        assert samples is not None and np.isnan(samples)
        assert coverage is not None and np.isnan(coverage)
    finally:
        await gateway.close()
        monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
        for gauge in (metrics.DRIFT_PSI, metrics.DRIFT_JS, metrics.DRIFT_SAMPLES):
            for labels in list(gauge._metrics):  # the NaN series this process now holds
                if labels[0] == "1":
                    gauge.remove(*labels)
        for gauge in (metrics.DRIFT_REFERENCE, metrics.CATALOG_COVERAGE, metrics.SERVED_POPULARITY):
            with contextlib.suppress(KeyError):
                gauge.remove("1")


async def test_disabled_drift_counts_nothing(exported: Path) -> None:
    gateway = Gateway(Settings(artifacts=exported, drift={"enabled": False}))
    await gateway.start()
    try:
        ctx, _ = await gateway.recommend(3, 5, {}, [], None)
        assert len(ctx.candidates) == 5 and gateway.drift.windows == {}
    finally:
        await gateway.close()


def test_bad_drift_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match="sub_windows"):
        Settings(drift={"sub_windows": 1})
