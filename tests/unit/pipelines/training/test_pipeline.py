"""The offline pipeline end to end on a small synthetic dataset, through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from cli.main import main
from core.export.repository import latest_version, sha256
from core.features.workflow import Workflow
from pipelines.data.schema import RawDataset

FAST = [
    "--dataset",
    "synthetic",
    "--users",
    "300",
    "--items",
    "400",
    "--interactions",
    "15000",
    "--two-tower-epochs",
    "2",
    "--bpr-epochs",
    "2",
    "--dlrm-epochs",
    "1",
    "--gbm-rounds",
    "20",
]
HOPELESS = ["--two-tower-epochs", "1", "--two-tower-lr", "1e-9"]  # learns nothing


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    root = tmp_path_factory.mktemp("pipeline")
    work, out = root / "work", root / "out"
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["train", "--workdir", str(work), "--output", str(out), *FAST]) == 0
    return work, out, printed.getvalue()


def test_last_line_is_the_report_path(run: tuple[Path, Path, str]) -> None:
    work, _, printed = run
    last = printed.strip().splitlines()[-1]
    assert Path(last) == (work / "report" / "report.json").resolve()
    report = json.loads(Path(last).read_text())
    assert set(report["retrieval"]["metrics"]) == {
        "two_tower",
        "bpr_mf",
        "popularity",
        "ease",
        "item_neighbors",
    }
    sources = report["retrieval"]["candidate_sources"]
    assert sources["budget"] == 300
    assert set(sources) == {"budget", "recall@300 ann", "recall@300 ann+item_neighbors_25"}
    assert all(0 < v <= 1 for k, v in sources.items() if k != "budget")
    assert [c["model"] for c in report["quality_checks"]] == ["two_tower", "ranker"]
    assert all(c["passed"] and not c["overridden"] for c in report["quality_checks"])
    assert set(report["ranking"]["metrics"]) == {"dlrm", "gbm", "blend"}
    for name in report["plots"].values():
        assert (work / "report" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_export_is_complete_and_consistent(run: tuple[Path, Path, str]) -> None:
    _, out, _ = run
    assert latest_version(out) == 1
    manifest = json.loads((out / "releases/1/manifest.json").read_text())
    assert manifest["dataset"].startswith("synthetic") and len(manifest["data_hash"]) == 16
    assert manifest["index"]["kind"] == "flat" and manifest["index"]["items"] == 400
    assert [c["passed"] for c in manifest["quality_checks"]] == [True, True]
    assert manifest["split_protocol"] == "global"
    for name, digest in manifest["files"].items():
        assert sha256(out / name) == digest
    assert {
        "releases/1/item_neighbors/neighbors.npy",
        "releases/1/item_neighbors/similarity.npy",
    } <= set(manifest["files"])
    tables = json.loads((out / "model_repository/ranker/1/embeddings/tables.json").read_text())
    for column, rows in tables["rows"].items():
        table = np.load(out / f"model_repository/ranker/1/embeddings/{column}.npy", mmap_mode="r")
        assert table.shape == (rows, tables["dim"]) and table.dtype == np.float32
    session = ort.InferenceSession(str(out / "model_repository/query_tower/1/model.onnx"))
    length = manifest["config"]["history_length"]  # the history the release's serving sends
    embedding = session.run(
        None,
        {"user_features": np.zeros((2, 5), np.int64), "history": np.zeros((2, length), np.int64)},
    )[0]
    # the two-tower's 64 dimensions, then the constant that meets each item's bias
    assert embedding.shape == (2, 65)
    np.testing.assert_array_equal(embedding[:, 64], 1.0)
    items = np.load(out / "releases/1/item_embeddings.npy")
    assert items.shape[1] == 65
    assert Workflow.load(out / "releases/1/workflow").ops


def test_second_export_adds_a_version(run: tuple[Path, Path, str]) -> None:
    work, out, _ = run
    before = (out / "model_repository/ranker/1/gbm.txt").read_bytes()
    assert main(["train", "export", "--workdir", str(work), "--output", str(out), *FAST]) == 0
    assert latest_version(out) == 2
    assert (out / "model_repository/ranker/1/gbm.txt").read_bytes() == before


def test_a_step_without_its_inputs_says_which_step_to_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["train", "export", "--workdir", str(tmp_path), "--output", str(tmp_path / "o")]) == 3
    )
    assert "run `cascade train prepare` first" in capsys.readouterr().err
    assert not (tmp_path / "o" / "releases" / "1").exists()


def test_bad_option_values_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:  # a usage error, before anything runs
        main(["train", "--dlrm-dim", "6"])
    assert stopped.value.code == 2
    assert "argument --dlrm-dim: dlrm_dim must be a multiple of 4" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "teleport"])


def test_help_explains_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    for option in (
        "--dataset",
        "--workdir",
        "--output",
        "--two-tower-epochs",
        "--dlrm-dim",
        "--seed",
        "--patience",
        "--eval-every",
        "--valid-users",
        "--split-protocol {global,per_user}",
        "--allow-below-popularity, --no-allow-below-popularity",
    ):
        assert option in text


def test_a_protocol_outside_the_choices_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--split-protocol", "weekly"])
    assert "--split-protocol: invalid choice: 'weekly'" in capsys.readouterr().err


def test_progress_is_one_line_per_epoch(run: tuple[Path, Path, str]) -> None:
    _, _, printed = run
    epoch_lines = [line for line in printed.splitlines() if " epoch " in line]
    assert 3 <= len(epoch_lines) <= 2 + 2 + 1  # two-tower, BPR-MF at most 2 each, DLRM 1
    assert len(printed.splitlines()) < 60 and "\r" not in printed


def test_a_two_tower_below_popularity_blocks_the_export_unless_overridden(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    paths = ["--workdir", str(work), "--output", str(out)]
    assert main(["train", *paths, *FAST, *HOPELESS]) == 3
    error = capsys.readouterr().err
    assert "two_tower does NOT beat popularity on valid ndcg@10" in error
    assert "--allow-below-popularity" in error
    assert not (out / "releases").exists() and not (work / "ranking_result.json").exists()
    # the override, given to the remaining steps, lets it through and is recorded
    assert main(["train", "ranking", "export", *paths, *FAST, "--allow-below-popularity"]) == 0
    manifest = json.loads((out / "releases/1/manifest.json").read_text())
    two_tower = manifest["quality_checks"][0]
    assert two_tower["model"] == "two_tower" and not two_tower["passed"]
    assert two_tower["overridden"]


def test_the_split_follows_the_protocol(small_dataset: RawDataset) -> None:
    from pipelines.config import TrainConfig
    from pipelines.pipeline import split_for

    users = small_dataset.interactions["user_id"].to_numpy()
    per_user = split_for(small_dataset, TrainConfig(split_protocol="per_user"))
    counts = np.bincount(users)
    tested = np.bincount(users[per_user.test], minlength=len(counts))
    assert (tested[counts >= 3] >= 1).all()  # every user is evaluated
    global_split = split_for(small_dataset, TrainConfig())
    sd = np.sqrt(0.09 * len(users))  # hashed: 10 % in expectation
    assert abs(len(global_split.test) - 0.1 * len(users)) < 4 * sd


def test_reported_validation_metrics_are_those_of_the_kept_weights(
    run: tuple[Path, Path, str],
) -> None:
    """The report reuses the kept epoch's validation instead of ranking the users again:
    a fresh evaluation of the saved two-tower must give the same numbers."""
    import torch

    from pipelines.config import TrainConfig
    from pipelines.prepare import RetrievalData
    from pipelines.training.retrieval import build_two_tower, evaluate_two_tower

    work, _, _ = run
    result = json.loads((work / "retrieval_result.json").read_text())
    data = RetrievalData.load(work / "retrieval.npz")
    config = TrainConfig()
    model = build_two_tower(Workflow.load(work / "workflow"), data.item_dense.shape[1], config)
    model.load_state_dict(torch.load(work / "models" / "two_tower.pt"))
    fresh = evaluate_two_tower(model, data, "valid", config.valid_users)
    assert set(fresh) == {"recall@10", "ndcg@10", "recall@20", "ndcg@20"}
    assert result["valid_metrics"]["two_tower"] == pytest.approx(fresh, abs=1e-9)
    assert set(result["valid_metrics"]["bpr_mf"]) == set(fresh)
    curve = result["curves"]["two_tower"]
    assert sum(1 for record in curve if record.get("best")) == 1


def test_two_tower_options_shape_the_built_towers(run: tuple[Path, Path, str]) -> None:
    from pipelines.config import TrainConfig
    from pipelines.prepare import RetrievalData
    from pipelines.training.retrieval import build_two_tower

    work, _, _ = run
    data = RetrievalData.load(work / "retrieval.npz")
    workflow = Workflow.load(work / "workflow")
    plain = build_two_tower(workflow, data.item_dense.shape[1], TrainConfig())
    assert plain.query.skip is None and plain.item.skip is None
    config = TrainConfig(
        two_tower_user_feature_dim=8, two_tower_item_feature_dim=24, two_tower_linear_skip=True
    )
    model = build_two_tower(workflow, data.item_dense.shape[1], config)
    assert all(table.embedding_dim == 8 for table in model.query.features)
    assert all(table.embedding_dim == 24 for table in model.item.features)
    assert model.query.skip is not None and model.item.skip is not None
    assert model.item.skip.out_features == config.two_tower_dim


def test_an_ensemble_trains_its_members_apart_and_exports_as_one_two_tower(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    from pipelines.config import TrainConfig
    from pipelines.models.two_tower_ensemble import TwoTowerEnsemble
    from pipelines.prepare import RetrievalData
    from pipelines.training.retrieval import build_two_tower, evaluate_two_tower

    work, out = tmp_path / "work", tmp_path / "out"
    paths = ["--workdir", str(work), "--output", str(out)]
    assert main(["train", *paths, *FAST, "--two-tower-ensemble", "2"]) == 0
    printed = capsys.readouterr().out
    assert "two-tower 1/2 epoch 1/2" in printed and "two-tower 2/2 epoch 1/2" in printed
    result = json.loads((work / "retrieval_result.json").read_text())
    members = [result["curves"][f"two_tower member {k}"] for k in (1, 2)]
    assert "two_tower" not in result["curves"]
    assert all(sum(1 for r in curve if r.get("best")) == 1 for curve in members)
    assert members[0][0]["loss"] != members[1][0]["loss"]  # own initialisation and batches
    # its validation is the ensemble's own, ranked again from the saved weights
    config = TrainConfig(two_tower_ensemble=2)
    data = RetrievalData.load(work / "retrieval.npz")
    model = build_two_tower(Workflow.load(work / "workflow"), data.item_dense.shape[1], config)
    assert isinstance(model, TwoTowerEnsemble)
    model.load_state_dict(torch.load(work / "models" / "two_tower.pt"))
    fresh = evaluate_two_tower(model, data, "valid", config.valid_users)
    assert result["valid_metrics"]["two_tower"] == pytest.approx(fresh, abs=1e-9)
    # served as one two-tower: the query tower's vector scores the release's item vectors
    manifest = json.loads((out / "releases/1/manifest.json").read_text())
    length = manifest["config"]["history_length"]
    session = ort.InferenceSession(str(out / "model_repository/query_tower/1/model.onnx"))
    users = [0, 1, 2]
    query = session.run(
        None, {"user_features": data.user_features[users], "history": data.history[users]}
    )[0]
    assert data.history.shape[1] == length
    items = np.load(out / "releases/1/item_embeddings.npy")
    assert query.shape == (3, 2 * 65) and items.shape == (400, 2 * 65)
    with torch.no_grad():
        vectors = model.served_query()(
            torch.from_numpy(data.user_features[users]), torch.from_numpy(data.history[users])
        )
        catalog = model.served_items(
            torch.from_numpy(data.item_features), torch.from_numpy(data.item_dense)
        )
    np.testing.assert_allclose(query @ items.T, (vectors @ catalog.T).numpy(), atol=1e-4)


def test_a_partial_run_saves_its_results_and_says_what_the_report_waits_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "work"
    steps = ["train", "prepare", "retrieval", "--workdir", str(work), "--output", str(tmp_path)]
    assert main([*steps, *FAST]) == 0
    printed = capsys.readouterr()
    assert "report: not written until `cascade train ranking` has run" in printed.out
    assert "error" not in printed.err
    assert (work / "retrieval_result.json").is_file()
    assert not (work / "report").exists()


def test_prepare_names_interactions_whose_user_or_item_the_tables_lack(tmp_path: Path) -> None:
    """A positive naming an id missing from its table fails with a DataError naming the data
    set and an example id (it used to take some other row's position silently)."""
    from core.errors import DataError
    from pipelines.data.synthetic import make_synthetic
    from pipelines.prepare import prepare

    data = make_synthetic(n_users=40, n_items=30, n_interactions=600, seed=0)
    for column, what in (("user_id", "user"), ("item_id", "item")):
        interactions = data.interactions.copy()
        interactions.loc[:, column] = interactions[column].where(interactions.index % 3 > 0, 999)
        interactions.loc[:, "rating"] = 5.0
        broken = RawDataset("broken", data.users, data.items, interactions)
        with pytest.raises(DataError, match=rf"^broken: \d+ interactions name a {what} id .*999"):
            prepare(broken, tmp_path / what)


def test_dlrm_returns_the_kept_epochs_validation_logits(run: tuple[Path, Path, str]) -> None:
    """The blend is fitted on the validation logits train_dlrm kept from validation (not
    recomputed): they must be the restored weights' logits, those of the best epoch."""
    import torch

    from pipelines.config import TrainConfig
    from pipelines.evaluation.metrics import auc
    from pipelines.training.ranking import build_dlrm, dlrm_logits, ranking_inputs, train_dlrm

    work, _, _ = run
    torch.manual_seed(0)
    config = TrainConfig(dlrm_epochs=6, dlrm_lr=0.2, patience=10, torch_threads=1)
    workflow = Workflow.load(work / "workflow")
    valid = ranking_inputs(work / "ranking_valid.parquet", workflow.schema)
    model = build_dlrm(workflow, valid["dense"].shape[1], config)
    curve, kept = train_dlrm(model, workflow.schema, work, valid, config, report=lambda _: None)
    best = [record for record in curve if record.get("best")]
    assert len(best) == 1 and len(curve) == 6
    np.testing.assert_allclose(kept, dlrm_logits(model, valid), rtol=1e-5, atol=1e-6)
    assert auc(valid["label"], kept) == pytest.approx(best[0]["valid_auc"], abs=1e-12)
    assert curve[-1] is not best[0]  # a learning rate this high overfits: the kept epoch is
    # not the last, so the last epoch's logits would fail the checks above
