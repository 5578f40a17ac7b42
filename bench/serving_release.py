"""The serving benchmark's releases: trained and exported once per catalog, cached under
bench/results/artifacts/, with the Triton adapters refreshed from the repository."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
from publish import RESULTS

ROOT = Path(__file__).resolve().parents[1]

CATALOGS = {
    "movielens": ["--dataset", "movielens"],
    "synthetic": [
        "--dataset",
        "synthetic",
        "--users",
        "100000",
        "--items",
        "1000000",
        "--interactions",
        "1000000",
        "--two-tower-epochs",
        "1",
        "--two-tower-batch",
        "2048",
        "--bpr-epochs",
        "1",
        "--dlrm-epochs",
        "1",
        "--gbm-rounds",
        "50",
        "--eval-users",
        "2000",
    ],
}


def ensure_release(name: str) -> Path:
    root = RESULTS / "artifacts" / name
    if not (root / "releases").is_dir() or not any((root / "releases").glob("*/manifest.json")):
        root.mkdir(parents=True, exist_ok=True)
        print(f"training the {name} release once (cached in {root}) ...", flush=True)
        with (root / "train.log").open("w") as train_log:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "cli.main",
                    "train",
                    "--workdir",
                    str(root / "work"),
                    "--output",
                    str(root),
                    *CATALOGS[name],
                ],
                check=True,
                cwd=ROOT,
                stdout=train_log,
                stderr=subprocess.STDOUT,
            )
    refresh_triton_files(root)
    return root


def refresh_triton_files(root: Path) -> None:
    """Bring the cached export's ``model.py``/``config.pbtxt`` up to the repository's (they
    are thin adapters of the code under test, so a cached release must not pin old ones),
    re-stamping the sha256 of each copied model.py in the release manifests."""
    from core.export.verify import file_sha256

    templates = ROOT / "model_repository"
    for manifest_path in (root / "releases").glob("*/manifest.json"):
        manifest = json.loads(manifest_path.read_text())
        for model, version in manifest.get("models", {}).items():
            shutil.copy(templates / model / "config.pbtxt", root / "model_repository" / model)
            target = root / "model_repository" / model / str(version) / "model.py"
            shutil.copy(templates / model / "model.py", target)
            name = f"model_repository/{model}/{version}/model.py"
            if name in manifest.get("files", {}):
                manifest["files"][name] = file_sha256(target)
        manifest_path.write_text(json.dumps(manifest, indent=2))


def user_ids(root: Path) -> list[int]:
    release = sorted((root / "releases").glob("*/manifest.json"))[-1].parent
    return pd.read_parquet(release / "online" / "users.parquet")["user_id"].astype(int).tolist()
