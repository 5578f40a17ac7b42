"""``cascade train --fit-workers 2`` on a real 2-worker Dask LocalCluster: a release that
verifies, whose fitted workflow (its saved files, byte for byte) and ranking rows equal the
in-memory run's; and the option combinations it refuses, as usage errors."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from cli.main import main
from core.export.verify import verify_version

pytestmark = pytest.mark.integration

DATA = ["--dataset", "synthetic", "--users", "300", "--items", "200", "--interactions", "8000"]
SHORT = [
    *("--seed", "3", "--two-tower-epochs", "2", "--bpr-epochs", "1", "--dlrm-epochs", "1"),
    *("--gbm-rounds", "10", "--allow-below-popularity"),
]


def _same_files(left: Path, right: Path) -> None:
    compared = filecmp.dircmp(left, right)
    assert not compared.left_only and not compared.right_only and not compared.diff_files
    for sub in compared.common_dirs:
        _same_files(left / sub, right / sub)


def test_train_on_two_workers_equals_the_in_memory_run(tmp_path: Path) -> None:
    cluster, memory = tmp_path / "cluster", tmp_path / "memory"
    output = tmp_path / "artifacts"
    places = ["--workdir", str(cluster), "--output", str(output)]
    assert main(["train", *DATA, *SHORT, "--fit-workers", "2", *places]) == 0
    [release] = (output / "releases").iterdir()
    assert verify_version(output, int(release.name)).files > 0
    assert not (cluster / "fit_partitions").exists()  # the cluster's copy is removed

    assert main(["train", "prepare", *DATA, *SHORT, "--workdir", str(memory)]) == 0
    _same_files(memory / "workflow", cluster / "workflow")
    _same_files(memory / "online", cluster / "online")
    assert filecmp.cmp(memory / "retrieval.npz", cluster / "retrieval.npz", shallow=False)
    for split in ("valid", "test"):  # held-out rows keep their order
        name = f"ranking_{split}.parquet"
        assert pq.read_table(memory / name).equals(pq.read_table(cluster / name))
    # training rows: the same rows, in another random order
    one, other = (pq.read_table(d / "ranking_train.parquet").to_pandas() for d in (memory, cluster))
    assert not one.equals(other)
    columns = list(one.columns)
    assert one.sort_values(columns, ignore_index=True).equals(
        other.sort_values(columns, ignore_index=True)
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ["train", "--fit-workers", "2", "--dask-scheduler", "tcp://127.0.0.1:8786"],
            "--fit-workers and --dask-scheduler exclude each other",
        ),
        (
            ["train", "--fit-workers", "2", "--split-protocol", "per_user"],
            "need --split-protocol global",
        ),
        (
            ["retrain", "--fit-workers", "2", "--dataset", "synthetic"],
            "cascade retrain cannot fit on a Dask cluster",
        ),
    ],
)
def test_unsupported_combinations_are_usage_errors(
    arguments: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Exit 2 with the options named, before any data is read or cluster started."""
    monkeypatch.delenv("CASCADE_REDIS__URL", raising=False)  # retrain: the file registry
    where = ["--artifacts", str(tmp_path)] if arguments[0] == "retrain" else []
    extra = ["--workdir", str(tmp_path / "work")] if arguments[0] == "train" else []
    assert main([*arguments, *where, *extra]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "work").exists()


def test_fit_workers_below_one_is_refused_by_the_parser(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--fit-workers", "0"])
    assert exit_.value.code == 2
    assert "--fit-workers: must be an integer >= 1, got '0'" in capsys.readouterr().err


def test_base_fraction_is_fitted_on_the_oldest_rows_only(tmp_path: Path) -> None:
    """The cluster reads the data set prepare was given (here cut to its oldest half)."""
    cut = [*DATA, "--seed", "2", "--base-fraction", "0.5"]
    assert main(["train", "prepare", *cut, "--workdir", str(tmp_path / "memory")]) == 0
    assert (
        main(["train", "prepare", *cut, "--fit-workers", "2", "--workdir", str(tmp_path / "c")])
        == 0
    )
    _same_files(tmp_path / "memory" / "workflow", tmp_path / "c" / "workflow")
    assert filecmp.cmp(
        tmp_path / "memory" / "ranking_test.parquet",
        tmp_path / "c" / "ranking_test.parquet",
        shallow=False,
    )
