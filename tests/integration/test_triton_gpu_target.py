"""The export's GPU target (``triton_target: gpu``) served by a real Triton (the
nvidia-pytriton wheel): the ranker calls its trees and its dense part as models of their own,
by name and version (business-logic scripting), and the reconcile loop loads them with it.

The wheel's Triton carries the python backend only, not FIL or ONNX Runtime. Here the two
parts are served by python-backend stand-ins with the exported configs' inputs and outputs,
answering what those backends answer on the same files the GPU image loads (FIL: the
LightGBM model's probability as ``output__0``; ONNX Runtime: the graph's ``logit``). What is
tested is the ranker's side and the control loop: the calls, the logit of FIL's probability
in the blend, parts loaded before the ranker, a lost part brought back. The GPU image itself
is not run here (no GPU, no NGC image: docs/deployment.md)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from core.errors import ArtifactError
from core.export.triton_gpu_configs import DENSE, TREES
from core.features.workflow import Workflow
from pipelines.config import TrainConfig
from pipelines.export.catalog import update_catalog
from pipelines.export.exporter import run_export
from pipelines.training.ranking import ranking_inputs
from services.inference.backends import RANKER
from services.inference.models import RankingModel
from services.inference.triton import TritonBackend
from services.inference.triton_server import TritonServer, TritonUnavailable, wheel_directory
from services.serving.release import load_release
from services.state.reconcile import Reconciler
from services.util.local_redis import free_port
from tests.conftest import EXPORTED_TRAINING

pytestmark = pytest.mark.integration

TREES_STAND_IN = """
from pathlib import Path

import triton_python_backend_utils as pb_utils

from services.inference.triton_python import input_array, keep_imports_lean, output_tensor

keep_imports_lean()
import lightgbm  # noqa: E402
import numpy as np  # noqa: E402


class TritonPythonModel:
    \"\"\"FIL's answer for a binary LightGBM model: the probability, one per row.\"\"\"

    def initialize(self, args):
        path = Path(args["model_repository"]) / args["model_version"] / "model.txt"
        self.booster = lightgbm.Booster(model_file=str(path))

    def execute(self, requests):
        answers = []
        for request in requests:
            rows = input_array(pb_utils.get_input_tensor_by_name(request, "input__0"))
            p = self.booster.predict(rows).astype(np.float32).reshape(-1, 1)
            outputs = [output_tensor(pb_utils.Tensor, "output__0", p)]
            answers.append(pb_utils.InferenceResponse(outputs))
        return answers
"""

DENSE_STAND_IN = """
from pathlib import Path

import onnxruntime
import triton_python_backend_utils as pb_utils

from services.inference.triton_python import input_array, output_tensor


class TritonPythonModel:
    \"\"\"ONNX Runtime's answer for the dense part: the graph's logit.\"\"\"

    def initialize(self, args):
        path = Path(args["model_repository"]) / args["model_version"] / "model.onnx"
        self.session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def execute(self, requests):
        answers = []
        for request in requests:
            feeds = {
                name: input_array(pb_utils.get_input_tensor_by_name(request, name))
                for name in ("dense", "embedded")
            }
            logit = self.session.run(["logit"], feeds)[0]
            outputs = [output_tensor(pb_utils.Tensor, "logit", logit)]
            answers.append(pb_utils.InferenceResponse(outputs))
        return answers
"""


def _stand_in(repository: Path, model: str, source: str) -> None:
    """Serve ``model`` with the python backend, keeping its exported inputs and outputs."""
    path = repository / model / "config.pbtxt"
    config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    config.ClearField("platform")
    config.ClearField("parameters")
    config.ClearField("optimization")
    config.backend = "python"
    for group in config.instance_group:
        group.kind = model_config_pb2.ModelInstanceGroup.KIND_CPU
    path.write_text(text_format.MessageToString(config))
    for version in (p for p in (repository / model).iterdir() if p.name.isdigit()):
        (version / "model.py").write_text(source)


@pytest.fixture(scope="module")
def gpu_export(exported: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `exported` fixture's work directory exported again with the GPU target."""
    root = tmp_path_factory.mktemp("gpu-export")
    config = TrainConfig(**EXPORTED_TRAINING, triton_target="gpu")  # type: ignore[arg-type]
    run_export(exported / "work", root, config, {"source": "synthetic"})
    return root


def test_the_gpu_target_publishes_checked_parts_in_the_release(
    gpu_export: Path, tmp_path: Path
) -> None:
    manifest = json.loads((gpu_export / "releases" / "1" / "manifest.json").read_text())
    assert manifest["models"] == {"query_tower": 1, RANKER: 1, TREES: 1, DENSE: 1}
    parity = manifest["fil_max_abs_difference"]
    assert parity["probability"] <= 1e-6 and parity["logit"] <= 1e-2
    assert 0.0 <= parity["saturated"] <= 1.0
    for name in (f"model_repository/{TREES}/1/model.txt", f"model_repository/{DENSE}/1/model.onnx"):
        assert name in manifest["files"]  # checksummed: a release load verifies them
    blend = json.loads((gpu_export / "model_repository" / RANKER / "1" / "blend.json").read_text())
    assert blend["triton_parts"] == {"trees": TREES, "dense": DENSE}
    release = load_release(gpu_export, 1)
    assert release.version == 1
    copy = tmp_path / "export"
    shutil.copytree(gpu_export, copy)

    # a catalog update carries the parts into its version (the ranker calls that version's)
    items = pd.read_parquet(copy / "releases" / "1" / "online" / "items.parquet")
    changed = items.iloc[:1][["item_id", "year", "genres"]]
    changed.to_parquet(tmp_path / "items.parquet", index=False)
    updated = update_catalog(copy, tmp_path / "items.parquet")
    models = json.loads(updated.manifest.read_text())["models"]
    assert models == {"query_tower": 2, RANKER: 2, TREES: 2, DENSE: 2}
    assert load_release(copy, 2).version == 2

    (copy / "model_repository" / TREES / "1" / "model.txt").write_text("tree\n")
    with pytest.raises(ArtifactError, match=r"model\.txt"):
        load_release(copy, 1)


@pytest.fixture(scope="module")
def served(
    gpu_export: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[TritonServer, Path]]:
    try:
        wheel_directory()
    except TritonUnavailable as error:
        pytest.skip(f"Triton cannot run here: {error}")
    repository = tmp_path_factory.mktemp("gpu-repository") / "model_repository"
    shutil.copytree(gpu_export / "model_repository", repository)
    _stand_in(repository, TREES, TREES_STAND_IN)
    _stand_in(repository, DENSE, DENSE_STAND_IN)
    server = TritonServer(
        repository,
        models=(),
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        log_file=repository.parent / "triton.log",
        env={"CASCADE_EMBEDDING_CACHE__IN_MEMORY_MAX_MB": "1024"},
    )
    server.start(timeout_s=90)
    yield server, repository
    server.stop()


def _rows(exported: Path) -> tuple[np.ndarray, np.ndarray]:
    workflow = Workflow.load(exported / "work" / "workflow")
    valid = ranking_inputs(exported / "work" / "ranking_valid.parquet", workflow.schema)
    return valid["sparse"][:300], valid["dense"][:300]


async def test_the_ranker_scores_through_its_parts_and_the_loop_brings_a_lost_part_back(
    exported: Path, gpu_export: Path, served: tuple[TritonServer, Path]
) -> None:
    server, repository = served
    backend = TritonBackend(
        server.http_url,
        control_key=server.control_key,
        model_repository=repository,
        models=(RANKER,),
    )
    await backend.start([1])
    try:
        assert list(backend.wanted([1])) == [TREES, DENSE, RANKER]  # the parts load first
        await backend.serve_versions([1])
        assert await backend.served_versions([1]) == {TREES: {1}, DENSE: {1}, RANKER: {1}}

        sparse, dense = _rows(exported)
        scores, degraded = await backend.rank(1, sparse, dense)
        local = RankingModel(gpu_export / "model_repository" / RANKER / "1")
        local.load()
        expected, _ = local.score(sparse, dense)
        assert not degraded
        # the trees' logit comes back from a float32 probability: close, not bit-equal
        np.testing.assert_allclose(scores.reshape(-1), expected, atol=2e-3)
        assert np.array_equal(np.argsort(-scores.reshape(-1))[:20], np.argsort(-expected)[:20])

        await backend.unload_model(DENSE)  # a part lost (an OOM-killed backend, an operator)
        with pytest.raises(Exception, match=DENSE):
            await backend.rank(1, sparse, dense)  # answered with the part's error, not hung
        reconciler = Reconciler(backend)
        before = await reconciler.observe([1])
        assert before.missing([1]) == [f"{DENSE} version 1 not ready on the inference server"]
        after = await reconciler.reconcile([1])
        assert after.missing([1]) == []
        again, _ = await backend.rank(1, sparse, dense)
        np.testing.assert_allclose(again.reshape(-1), expected, atol=2e-3)
    finally:
        await backend.close()


def test_serve_with_the_wheels_triton_refuses_a_gpu_target_release(
    gpu_export: Path,
    exported: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The wheel's Triton has no FIL backend: `cascade serve --triton` says so before it
    starts, writes or sets anything, and names the ways out."""
    import os

    for name in [n for n in os.environ if n.startswith("CASCADE_")]:
        monkeypatch.setenv(name, os.environ[name])  # restored after the test
    before = {n: v for n, v in os.environ.items() if n.startswith("CASCADE_")}
    from cli.main import main
    from services.inference.triton_server import check_backends

    try:
        backends = wheel_directory() / "backends"
    except TritonUnavailable as error:
        pytest.skip(f"Triton cannot run here: {error}")
    assert main(["serve", "--triton", "--artifacts", str(gpu_export)]) == 3  # failed
    error = capsys.readouterr().err
    assert "ranker version 1 was exported for the GPU image" in error
    assert "ranker_dense runs on Triton's onnxruntime backend" in error
    assert "without --triton" in error
    assert {n: v for n, v in os.environ.items() if n.startswith("CASCADE_")} == before
    assert not (gpu_export / "feedback.key").exists()
    check_backends(exported / "model_repository", 1, backends)  # a CPU-target release: fine
