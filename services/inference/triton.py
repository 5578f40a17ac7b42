"""Inference on a Triton server (HTTP or gRPC, asyncio clients): the same two models,
addressed by name and version; model control (load/unload) with the server's control key."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from core.export.triton_gpu_configs import ranker_parts
from services.inference.backends import QUERY_TOWER, RANKER, InferenceBackend

_TRITON_TYPES = {np.dtype(np.int64): "INT64", np.dtype(np.float32): "FP32"}
# Header that Triton's restricted APIs check (see services.inference.triton_server); over gRPC the
# server expects it as metadata key GRPC_METADATA_PREFIX + CONTROL_KEY_HEADER.
CONTROL_KEY_HEADER = "triton-control-key"
GRPC_METADATA_PREFIX = "triton-grpc-protocol-"


class TritonBackend(InferenceBackend):
    """``tritonclient`` asyncio client; one ``infer`` per call."""

    def __init__(
        self,
        url: str,
        protocol: str = "http",
        control_key: str | None = None,
        model_repository: Path | None = None,
        models: tuple[str, ...] = (QUERY_TOWER, RANKER),
    ) -> None:
        self.url = url
        self.models = models  # the models whose versions serve_versions manages
        self.protocol = protocol
        self._control_key = control_key
        self.model_repository = model_repository  # the configs serve_versions loads with
        self._parts: dict[int, dict[str, str]] = {}  # ranker version -> the models it calls
        self._loaded_parts: set[str] = set()
        self._client: Any = None
        self._module: Any = None

    def __repr__(self) -> str:  # never shows the control key
        return f"TritonBackend({self.url!r}, {self.protocol!r})"

    async def start(self, versions: list[int]) -> None:
        if self.protocol == "grpc":
            import tritonclient.grpc as module
            import tritonclient.grpc.aio as aio
        else:
            import tritonclient.http as module
            import tritonclient.http.aio as aio
        self._module = module
        self._client = aio.InferenceServerClient(self.url)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def ready(self, model: str, version: int) -> bool:
        return bool(await self._client.is_model_ready(model, str(version)))

    def _control_headers(self) -> dict[str, str]:
        if self._client is None:
            raise RuntimeError("TritonBackend.start() was not called")
        if not self._control_key:
            return {}
        prefix = GRPC_METADATA_PREFIX if self.protocol == "grpc" else ""
        return {prefix + CONTROL_KEY_HEADER: self._control_key}

    async def load_model(self, model: str, config: dict | None = None) -> None:
        """(Re)load ``model`` (explicit model control), optionally with an override config;
        sends the control key. Raises the client's exception when the server refuses."""
        headers = self._control_headers()
        await self._client.load_model(
            model, headers=headers, config=json.dumps(config) if config else None
        )

    def parts_of(self, version: int) -> dict[str, str]:
        """The models ranker ``version`` calls on this server: its blend.json's
        ``triton_parts`` (a GPU-target export: the trees on FIL, DLRM's dense part on ONNX
        Runtime); none for a CPU-target version. Versions never change, so it is read once."""
        if RANKER not in self.models or self.model_repository is None:
            return {}
        if version not in self._parts:
            try:
                parts = ranker_parts(self.model_repository / RANKER / str(version))
            except (OSError, ValueError):  # not there yet: the ranker's own load says so
                return {}
            self._parts[version] = parts
        return self._parts[version]

    def wanted(self, versions: Iterable[int]) -> dict[str, set[int]]:
        """Each model to serve with its versions, the parts a ranker calls first (they must
        be ready before it answers): this backend's models at every version, a part at the
        versions whose ranker calls it."""
        numbers = sorted(set(versions))
        wanted: dict[str, set[int]] = {}
        for version in numbers:
            for part in self.parts_of(version).values():
                wanted.setdefault(part, set()).add(version)
        return wanted | {model: set(numbers) for model in self.models}

    async def serve_versions(self, versions: list[int]) -> None:
        """Load this backend's models with exactly ``versions`` (their config.pbtxt with a
        ``specific`` version policy), and the GPU parts their rankers call first: Triton
        loads the new versions, keeps serving the old ones until the new are ready, then
        unloads those not listed. With the query tower in the gateway only the ranker is
        Triton's: a canary starts half the python stubs."""
        wanted = self.wanted(versions)
        for model, numbers in wanted.items():
            await self.load_model(model, self.config_with_versions(model, sorted(numbers)))
        for part in self._loaded_parts - wanted.keys():  # no version calls it any more
            await self.unload_model(part)
        self._loaded_parts = set(wanted) - set(self.models)
        for model, numbers in wanted.items():
            for version in sorted(numbers):
                if not await self.ready(model, version):
                    raise RuntimeError(f"Triton loaded {model} but version {version} is not ready")

    def config_with_versions(self, model: str, versions: list[int]) -> dict:
        """The model's config.pbtxt as Triton's JSON config, serving exactly ``versions``."""
        from google.protobuf import json_format, text_format
        from tritonclient.grpc import model_config_pb2

        if self.model_repository is None:
            raise RuntimeError("TritonBackend needs the model repository to change versions")
        text = (self.model_repository / model / "config.pbtxt").read_text()
        config = text_format.Parse(text, model_config_pb2.ModelConfig())
        config.ClearField("version_policy")
        config.version_policy.specific.versions.extend(sorted(versions))
        return dict(json_format.MessageToDict(config, preserving_proto_field_name=True))

    async def served_versions(self, versions: Iterable[int]) -> dict[str, set[int]]:
        """The versions of each of this backend's models (and of the parts its rankers
        call) that the server reports READY (a version still loading or unloading is not
        served). With the control key: all of
        them, from the repository index (a restricted API); without: those of ``versions``
        that the open readiness API calls ready. Raises when the server cannot be asked."""
        wanted = self.wanted(versions)
        served: dict[str, set[int]] = {model: set() for model in wanted}
        if not self._control_key:
            for model, numbers in wanted.items():
                for version in sorted(numbers):
                    if await self.ready(model, version):
                        served[model].add(version)
            return served
        headers = self._control_headers()
        if self.protocol == "grpc":
            answer = await self._client.get_model_repository_index(headers=headers, as_json=True)
            entries = answer.get("models", [])
        else:
            entries = await self._client.get_model_repository_index(headers=headers)
        for entry in entries:
            number = str(entry.get("version", ""))
            if entry.get("name") in served and entry.get("state") == "READY" and number.isdigit():
                served[entry["name"]].add(int(number))
        return served

    async def unload_model(self, model: str) -> None:
        """Unload ``model`` (explicit model control); sends the control key."""
        await self._client.unload_model(model, headers=self._control_headers())

    async def _infer(
        self, model: str, version: int, inputs: dict[str, np.ndarray], outputs: list[str]
    ) -> list[np.ndarray]:
        if self._client is None:
            raise RuntimeError("TritonBackend.start() was not called")
        tensors = []
        for name, array in inputs.items():
            tensor = self._module.InferInput(name, list(array.shape), _TRITON_TYPES[array.dtype])
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        requested = [self._module.InferRequestedOutput(name) for name in outputs]
        result = await self._client.infer(
            model, tensors, model_version=str(version), outputs=requested
        )
        return [result.as_numpy(name) for name in outputs]

    async def encode_query(
        self, version: int, user_features: np.ndarray, history: np.ndarray
    ) -> np.ndarray:
        inputs = {
            "user_features": user_features.astype(np.int64),
            "history": history.astype(np.int64),
        }
        return (await self._infer(QUERY_TOWER, version, inputs, ["embedding"]))[0]

    async def rank(
        self, version: int, sparse: np.ndarray, dense: np.ndarray
    ) -> tuple[np.ndarray, bool]:
        inputs: dict[str, np.ndarray] = {
            "sparse": sparse.astype(np.int64),
            "dense": dense.astype(np.float32),
        }
        score, degraded = await self._infer(RANKER, version, inputs, ["score", "degraded"])
        return score, bool(np.asarray(degraded).any())
