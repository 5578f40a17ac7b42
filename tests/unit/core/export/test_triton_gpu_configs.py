"""core/export/triton_gpu_configs.py: the GPU image's model configs, built from a real
LightGBM model and a real ONNX graph, parsed by Triton's own ModelConfig schema (the
protobuf tritonclient ships), laid out as a model repository; bad inputs name the file."""

from __future__ import annotations

from pathlib import Path

import lightgbm as lgb
import numpy as np
import pytest
import torch
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from core.errors import ArtifactError
from core.export import triton_gpu_configs as gpu
from core.export.repository import VersionWriter

FEATURES = 5


class Dense(torch.nn.Module):
    """Stands in for DLRM's dense part: (dense, embedded) -> logit."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3 + 2 * 4, 1)

    def forward(self, dense: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.cat([dense, embedded.flatten(1)], dim=1))


@pytest.fixture
def ranker_version(tmp_path: Path) -> Path:
    """An exported ranker version's two learnt parts (gbm.txt, dlrm_dense.onnx)."""
    version = tmp_path / "ranker" / "3"
    version.mkdir(parents=True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, FEATURES))
    y = (x[:, 0] + rng.normal(scale=0.1, size=200) > 0).astype(int)
    booster = lgb.train(
        {"objective": "binary", "verbose": -1, "num_leaves": 4}, lgb.Dataset(x, y), 5
    )
    booster.save_model(str(version / gpu.TREE_MODEL))
    sample = (torch.zeros(2, 3), torch.zeros(2, 2, 4))
    torch.onnx.export(
        Dense().eval(),
        sample,
        str(version / gpu.DENSE_MODEL),
        input_names=["dense", "embedded"],
        output_names=["logit"],
        dynamic_axes={name: {0: "batch"} for name in ("dense", "embedded", "logit")},
        dynamo=False,
    )
    return version


def parse(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def test_configs_follow_the_models_and_parse_as_triton_model_configs(
    ranker_version: Path,
) -> None:
    configs = gpu.gpu_model_configs(ranker_version, tensorrt=True)
    trees, dense = parse(configs[gpu.TREES]), parse(configs[gpu.DENSE])

    assert trees.backend == "fil" and trees.name == gpu.TREES
    assert [list(i.dims) for i in trees.input] == [[FEATURES]]
    assert trees.parameters["model_type"].string_value == "lightgbm"
    assert trees.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU

    assert dense.platform == "onnxruntime_onnx"
    assert {i.name: list(i.dims) for i in dense.input} == {"dense": [3], "embedded": [2, 4]}
    assert {o.name: list(o.dims) for o in dense.output} == {"logit": [1]}
    assert all(i.data_type == model_config_pb2.TYPE_FP32 for i in dense.input)
    accelerator = dense.optimization.execution_accelerators.gpu_execution_accelerator[0]
    assert accelerator.name == "tensorrt" and accelerator.parameters["precision_mode"] == "FP16"


def test_without_tensorrt_no_accelerator(ranker_version: Path) -> None:
    dense = parse(gpu.gpu_model_configs(ranker_version)[gpu.DENSE])
    assert not dense.optimization.execution_accelerators.gpu_execution_accelerator


def test_write_publishes_the_writers_version_and_never_overwrites(
    ranker_version: Path, tmp_path: Path
) -> None:
    root = tmp_path / "export"
    writer = VersionWriter(root)
    version = writer.claim()
    written = gpu.write_gpu_models(ranker_version, writer)
    repository = root / "model_repository"
    assert sorted((p.parent.name, p.name) for p in written) == [
        (gpu.DENSE, str(version)),
        (gpu.TREES, str(version)),
    ]
    assert (repository / gpu.TREES / str(version) / "model.txt").read_bytes() == (
        ranker_version / gpu.TREE_MODEL
    ).read_bytes()
    assert (repository / gpu.DENSE / str(version) / "model.onnx").is_file()
    assert parse((repository / gpu.DENSE / "config.pbtxt").read_text()).name == gpu.DENSE
    assert not list(repository.glob("*/.staging-*")) and not list(repository.glob("*/*.tmp"))
    with pytest.raises(ArtifactError, match="already exists"):
        gpu.write_gpu_models(ranker_version, writer)


def test_a_one_value_per_row_output_is_given_dims_1_reshaped(tmp_path: Path) -> None:
    """DLRM's dense part answers ``[batch]``: Triton's batched dims cannot be empty, so the
    config says ``[1]`` and reshapes to the model's own shape."""

    class Squeezed(torch.nn.Module):
        def forward(self, dense: torch.Tensor) -> torch.Tensor:
            return dense.sum(dim=1)

    path = tmp_path / "squeezed.onnx"
    torch.onnx.export(
        Squeezed(),
        (torch.zeros(2, 3),),
        str(path),
        input_names=["dense"],
        output_names=["logit"],
        dynamic_axes={"dense": {0: "batch"}, "logit": {0: "batch"}},
        dynamo=False,
    )
    inputs, outputs = gpu.onnx_tensor_specs(path)
    config = parse(gpu.onnx_config("d", inputs, outputs))
    assert list(config.output[0].dims) == [1]
    assert config.output[0].HasField("reshape") and list(config.output[0].reshape.shape) == []


def test_a_missing_model_is_named(ranker_version: Path) -> None:
    (ranker_version / gpu.DENSE_MODEL).unlink()
    with pytest.raises(ArtifactError, match=r"dlrm_dense\.onnx: missing"):
        gpu.gpu_model_configs(ranker_version)


def test_a_text_that_is_no_lightgbm_model_is_named(tmp_path: Path) -> None:
    path = tmp_path / "gbm.txt"
    path.write_text("tree\nversion=v4\n")
    with pytest.raises(ArtifactError, match="no max_feature_idx"):
        gpu.tree_feature_count(path)
    with pytest.raises(ArtifactError, match="at least one feature"):
        gpu.fil_config("t", 0)


def test_a_broken_onnx_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "dlrm_dense.onnx"
    path.write_bytes(b"not a graph")
    with pytest.raises(ArtifactError, match="cannot load the ONNX model"):
        gpu.onnx_tensor_specs(path)
