"""A workflow: feature ops applied in order, fitted once offline, saved, and reused online.

Saved as a directory with ``workflow.json`` (op types and configs) and ``arrays.npz`` (fitted
state), loaded without pickle. ``transform`` is the one code path for offline batches and
online requests, which is what makes their features identical.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from core.errors import ArtifactError
from core.features.ops import REGISTRY, Columns, FeatureOp
from core.features.schema import MOVIELENS, FeatureSchema

FORMAT_VERSION = 1


class Workflow:
    """An ordered list of feature ops; later ops may read earlier ops' outputs, and the
    schema they were built for (which columns the models read)."""

    def __init__(self, ops: list[FeatureOp], schema: FeatureSchema = MOVIELENS) -> None:
        self.ops = ops
        self.schema = schema

    def fit_transform(self, columns: Columns) -> Columns:
        """Fit every op on the training rows and return the rows with all outputs added.

        Ops that could leak the label (target encoding) encode these rows out of fold.
        """
        columns = dict(columns)
        for op in self.ops:
            columns.update(op.fit_transform(columns))
        return columns

    def transform(self, columns: Columns, partial: bool = False, reuse: bool = False) -> Columns:
        """Add every op's outputs to ``columns``.

        With ``partial=True`` ops whose inputs are absent are skipped, so item-only or
        user-only rows can be encoded (retrieval towers, per-release item caches). With
        ``reuse=True`` ops whose outputs are all present already are skipped: serving encodes
        the catalog once and the user once, then finishes the rows of a request here. Every op
        is row-wise, so the result is the same as one full transform.
        """
        columns = dict(columns)
        for op in self.ops:
            if partial and any(c not in columns for c in op.transform_inputs):
                continue
            if reuse and all(c in columns for c in op.outputs):
                continue
            columns.update(op.transform(columns))
        return columns

    def op(self, output: str) -> FeatureOp:
        """The op that writes column ``output``."""
        for op in self.ops:
            if output in op.outputs:
                return op
        raise KeyError(f"no op writes {output!r}")

    def save(self, directory: Path) -> None:
        """Write ``workflow.json`` and ``arrays.npz`` into ``directory`` (created if needed)."""
        directory.mkdir(parents=True, exist_ok=True)
        spec = {
            "format_version": FORMAT_VERSION,
            "ops": [{"kind": op.kind, "config": op.config()} for op in self.ops],
            "schema": self.schema.to_dict(),
        }
        arrays = {
            f"{i}/{name}": value
            for i, op in enumerate(self.ops)
            for name, value in op.arrays().items()
        }
        np.savez(directory / "arrays.npz", **arrays)  # type: ignore[arg-type]
        (directory / "workflow.json").write_text(json.dumps(spec, indent=2))

    @classmethod
    def load(cls, directory: Path) -> Workflow:
        """Rebuild a fitted workflow saved by ``save``."""
        spec_path = directory / "workflow.json"
        if not spec_path.is_file():
            raise ArtifactError(f"{spec_path}: fitted workflow is missing")
        try:
            spec = json.loads(spec_path.read_text())
        except json.JSONDecodeError as error:
            raise ArtifactError(f"{spec_path}: not valid JSON ({error})") from None
        if spec.get("format_version") != FORMAT_VERSION:
            raise ArtifactError(
                f"{spec_path}: format_version {spec.get('format_version')!r}, "
                f"expected {FORMAT_VERSION}"
            )
        with np.load(directory / "arrays.npz", allow_pickle=False) as saved:
            stored = {key: saved[key] for key in saved.files}
        ops: list[FeatureOp] = []
        for i, entry in enumerate(spec["ops"]):
            if entry["kind"] not in REGISTRY:
                raise ArtifactError(f"{spec_path}: unknown op kind {entry['kind']!r}")
            op = REGISTRY[entry["kind"]](**entry["config"])
            prefix = f"{i}/"
            op.load_arrays({k[len(prefix) :]: v for k, v in stored.items() if k.startswith(prefix)})
            ops.append(op)
        # workflows saved before schemas were recorded are MovieLens's
        schema = spec.get("schema")
        return cls(ops, FeatureSchema.from_dict(schema) if schema is not None else MOVIELENS)
