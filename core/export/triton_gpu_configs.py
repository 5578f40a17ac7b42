"""Triton model configs for the GPU image (Dockerfile.triton-gpu): the ranker's two learnt
parts as native backends instead of inside the python backend.

    ranker_trees   the LightGBM model (the ranker's ``gbm.txt``) on the FIL backend
    ranker_dense   DLRM's dense part (the ranker's ``dlrm_dense.onnx``) on ONNX Runtime,
                   with TensorRT as its execution accelerator where asked

``gpu_model_configs`` reads the shapes from an exported ranker version (the tree model's
feature count from its text, the ONNX graph's inputs and outputs from ONNX Runtime) and
returns each model's ``config.pbtxt``; ``write_gpu_models`` publishes them into a release's
model repository (``<name>/config.pbtxt``, ``<name>/<version>/model.txt`` or ``model.onnx``)
beside the ranker version that calls them. What stays in the python backend (the
embedding-cache lookup from Redis, the blend) is the ranker's ``model.py``, which calls these
two by name and version (business-logic scripting) when its ``blend.json`` lists them.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from core.errors import ArtifactError
from core.export.repository import VersionWriter

TREE_MODEL = "gbm.txt"  # in model_repository/ranker/<version>/
DENSE_MODEL = "dlrm_dense.onnx"
BLEND = "blend.json"  # the ranker version's blend; ``PARTS`` names the models it calls
PARTS = "triton_parts"
TREES = "ranker_trees"
DENSE = "ranker_dense"

# ONNX Runtime's element types as Triton's config data types
_ONNX_TYPES = {
    "tensor(float)": "TYPE_FP32",
    "tensor(float16)": "TYPE_FP16",
    "tensor(double)": "TYPE_FP64",
    "tensor(int64)": "TYPE_INT64",
    "tensor(int32)": "TYPE_INT32",
    "tensor(bool)": "TYPE_BOOL",
}


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a model: its name, Triton data type and dims without the
    batch dimension (-1 where variable)."""

    name: str
    data_type: str
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None = None  # the model's own shape, where dims differ

    def pbtxt(self) -> str:
        dims = ", ".join(str(d) for d in self.dims)
        text = f'{{ name: "{self.name}", data_type: {self.data_type}, dims: [ {dims} ]'
        if self.reshape is not None:
            text += f" reshape: {{ shape: [ {', '.join(str(d) for d in self.reshape)} ] }}"
        return text + " }"


def ranker_parts(ranker_version: Path) -> dict[str, str]:
    """The models a ranker version calls on Triton (its blend.json's ``triton_parts``: a
    GPU-target export's trees and dense part); empty for a CPU-target version. Raises
    ``OSError`` or ``ValueError`` when the blend cannot be read."""
    blend = json.loads((ranker_version / BLEND).read_text())
    return {str(k): str(v) for k, v in dict(blend.get(PARTS) or {}).items()}


def tree_feature_count(model_text: Path) -> int:
    """The number of features a LightGBM text model reads (``max_feature_idx`` + 1)."""
    try:
        with model_text.open() as lines:
            for line in lines:
                if line.startswith("max_feature_idx="):
                    return int(line.split("=", 1)[1]) + 1
    except (OSError, ValueError) as error:
        raise ArtifactError(f"{model_text}: cannot read the tree model: {error}") from error
    raise ArtifactError(f"{model_text}: no max_feature_idx line: not a LightGBM text model")


def onnx_tensor_specs(model: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs and outputs of an ONNX graph whose first dimension is the batch."""
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own exception types
        raise ArtifactError(f"{model}: cannot load the ONNX model: {error}") from error

    def spec(arg: ort.NodeArg) -> TensorSpec:
        if arg.type not in _ONNX_TYPES:
            raise ArtifactError(
                f"{model}: {arg.name} has type {arg.type}, which Triton's config here does not map"
            )
        dims = tuple(d if isinstance(d, int) else -1 for d in arg.shape[1:])
        if not dims:  # one value per row ([batch]): Triton's batched dims must not be empty
            return TensorSpec(arg.name, _ONNX_TYPES[arg.type], (1,), reshape=())
        return TensorSpec(arg.name, _ONNX_TYPES[arg.type], dims)

    return [spec(a) for a in session.get_inputs()], [spec(a) for a in session.get_outputs()]


def fil_config(name: str, features: int, *, max_batch_size: int = 2048, instances: int = 1) -> str:
    """The FIL backend's config for a LightGBM binary classifier: FP32 features in, the
    model's probability out (FIL applies the model's sigmoid; the blend takes its logit)."""
    if features < 1:
        raise ArtifactError(f"{name}: a tree model needs at least one feature, got {features}")
    return "\n".join(
        [
            f'name: "{name}"',
            'backend: "fil"',
            f"max_batch_size: {max_batch_size}",
            f"input [ {TensorSpec('input__0', 'TYPE_FP32', (features,)).pbtxt()} ]",
            f"output [ {TensorSpec('output__0', 'TYPE_FP32', (1,)).pbtxt()} ]",
            f"instance_group [ {{ count: {instances}, kind: KIND_GPU }} ]",
            "parameters [",
            '  { key: "model_type", value: { string_value: "lightgbm" } },',
            '  { key: "output_class", value: { string_value: "false" } },',
            '  { key: "storage_type", value: { string_value: "AUTO" } }',
            "]",
            "dynamic_batching { max_queue_delay_microseconds: 200 }",
            "",
        ]
    )


def onnx_config(
    name: str,
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    *,
    max_batch_size: int = 2048,
    instances: int = 1,
    tensorrt: bool = False,
) -> str:
    """ONNX Runtime's config on the GPU; with ``tensorrt``, TensorRT (FP16) accelerates the
    graph where it can and ONNX Runtime's CUDA kernels run the rest."""
    if not inputs or not outputs:
        raise ArtifactError(f"{name}: an ONNX model needs inputs and outputs")
    lines = [
        f'name: "{name}"',
        'platform: "onnxruntime_onnx"',
        f"max_batch_size: {max_batch_size}",
        "input [",
        ",\n".join(f"  {t.pbtxt()}" for t in inputs),
        "]",
        "output [",
        ",\n".join(f"  {t.pbtxt()}" for t in outputs),
        "]",
        f"instance_group [ {{ count: {instances}, kind: KIND_GPU }} ]",
        "dynamic_batching { max_queue_delay_microseconds: 200 }",
    ]
    if tensorrt:
        lines += [
            "optimization { execution_accelerators { gpu_execution_accelerator: [ {",
            '  name: "tensorrt"',
            '  parameters { key: "precision_mode" value: "FP16" }',
            "} ] } }",
        ]
    return "\n".join([*lines, ""])


def gpu_model_configs(ranker_version: Path, *, tensorrt: bool = False) -> dict[str, str]:
    """Each GPU model's config.pbtxt, from an exported ranker version directory."""
    trees, dense = ranker_version / TREE_MODEL, ranker_version / DENSE_MODEL
    for path in (trees, dense):
        if not path.is_file():
            raise ArtifactError(f"{path}: missing (not an exported ranker version)")
    inputs, outputs = onnx_tensor_specs(dense)
    return {
        TREES: fil_config(TREES, tree_feature_count(trees)),
        DENSE: onnx_config(DENSE, inputs, outputs, tensorrt=tensorrt),
    }


def write_gpu_models(
    ranker_version: Path, writer: VersionWriter, *, tensorrt: bool = False
) -> list[Path]:
    """Publish the GPU models of one ranker version as ``writer``'s version (staged, then
    renamed into place; an existing version is never overwritten) and write each model's
    config.pbtxt (replaced atomically); returns the published version directories."""
    configs = gpu_model_configs(ranker_version, tensorrt=tensorrt)
    files = {TREES: (TREE_MODEL, "model.txt"), DENSE: (DENSE_MODEL, "model.onnx")}
    written = []
    for name, config in configs.items():
        staged = writer.staging(name)
        source, served_as = files[name]
        shutil.copyfile(ranker_version / source, staged / served_as)
        written.append(writer.publish(name, staged))
        target = writer.root / "model_repository" / name / "config.pbtxt"
        temporary = target.with_suffix(".tmp")
        temporary.write_text(config)
        temporary.replace(target)
    return written
