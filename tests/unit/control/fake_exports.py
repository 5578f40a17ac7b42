"""Small fake export trees: the files retention and `cascade versions` look at, no training."""

from __future__ import annotations

import json
from pathlib import Path

MODELS = ("query_tower", "ranker")


def make_version(
    root: Path, version: int, complete: bool = True, recall: float = 0.1625, auc: float = 0.7267
) -> None:
    """``releases/<v>/`` (with a manifest when ``complete``) and ``model_repository/*/<v>/``."""
    release = root / "releases" / str(version)
    release.mkdir(parents=True)
    (release / "items.npy").write_bytes(b"\0" * 16)
    for model in MODELS:
        directory = root / "model_repository" / model / str(version)
        directory.mkdir(parents=True)
        (directory / "model.onnx").write_bytes(b"\1" * 16)
    if complete:
        metrics = {
            "retrieval": {"two_tower": {"recall@10": recall, "ndcg@10": recall / 2}},
            "ranking": {"blend": {"auc": auc, "logloss": 0.5}},
        }
        manifest = {"version": version, "created_at": "2026-11-22T13:52:23Z", "metrics": metrics}
        (release / "manifest.json").write_text(json.dumps(manifest))


def version_paths(root: Path, version: int) -> list[Path]:
    models = [root / "model_repository" / model / str(version) for model in MODELS]
    return [root / "releases" / str(version), *models]


def on_disk(root: Path, version: int) -> bool:
    """Any directory of ``version`` left (or a ``.deleting-`` leftover of one)."""
    return any(p.exists() for p in version_paths(root, version))


def leftovers(root: Path) -> list[Path]:
    return sorted(root.glob("releases/.deleting-*")) + sorted(
        root.glob("model_repository/*/.deleting-*")
    )


PASS = {"verdict": "pass", "failed_checks": [], "forced": False}
FAIL = {"verdict": "fail", "failed_checks": ["recall@10 below production"], "forced": False}
FORCED = {"verdict": "fail", "failed_checks": ["auc below floor"], "forced": True}


def production_and_candidate(root: Path) -> Path:
    """An export root for rollouts: version 1 adopted as production, version 2 a candidate
    the gate passed (file registry)."""
    from control.registry import FileRegistry

    registry = FileRegistry(root / "registry.json")
    for version in (1, 2):
        make_version(root, version)
    registry.adopt(1, "first deploy")
    registry.register(2, PASS)
    return root
