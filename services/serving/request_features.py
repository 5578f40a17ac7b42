"""The models' inputs for one request, from the release's fitted workflow.

The same workflow as training, split by what each part depends on, so a request does only
the work that is its own:

- the catalog's item columns are encoded once, when the release loads;
- the user is encoded once per request and shared by the query tower and the ranker (kept
  on the request context);
- only the ops that need both sides (event time, standardisation) run on the candidates'
  rows, and those rows carry only the columns those ops and the models read.

Every op is row-wise, so the result equals one full transform of the joined rows (tested).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from core.features.ops import Columns
from core.features.schema import FeatureSchema
from core.features.spec import DENSE, dense_block
from core.features.workflow import Workflow
from services.serving.context import RequestContext

TIMESTAMP = "timestamp"


def raw_user(schema: FeatureSchema, user_id: int, attributes: Mapping[str, str | None]) -> Columns:
    """One user's raw row: the id and every attribute (None where the store has none)."""
    row: Columns = {"user_id": np.asarray([user_id], dtype=np.int64)}
    for name in schema.user_attributes:
        row[name] = np.asarray([attributes.get(name)], dtype=object)
    return row


class ItemRows:
    """Item columns packed row-wise, one matrix per dtype, so gathering the candidates reads
    each item's values from adjacent memory (one fancy index per dtype instead of one per
    column: 300 random rows of a 1M-item catalog are cache misses)."""

    def __init__(self, columns: Columns) -> None:
        self.blocks: list[tuple[np.ndarray, dict[str, tuple[int, int, bool]]]] = []
        for dtype in sorted({v.dtype.str for v in columns.values()}):
            names = [k for k, v in columns.items() if v.dtype.str == dtype]
            parts = [columns[k].reshape(len(columns[k]), -1) for k in names]
            layout, start = {}, 0
            for name, part in zip(names, parts, strict=True):
                layout[name] = (start, part.shape[1], columns[name].ndim == 1)
                start += part.shape[1]
            self.blocks.append((np.ascontiguousarray(np.concatenate(parts, axis=1)), layout))

    def __contains__(self, name: str) -> bool:
        return any(name in layout for _, layout in self.blocks)

    def gather(self, positions: np.ndarray) -> Columns:
        """Every column at ``positions``, each the shape its original column had."""
        rows: Columns = {}
        for matrix, layout in self.blocks:
            block = matrix[positions]
            for name, (start, width, flat) in layout.items():
                rows[name] = block[:, start] if flat else block[:, start : start + width]
        return rows


class RequestFeatures:
    """One release's request-time encoder (built when the release loads)."""

    def __init__(self, workflow: Workflow, item_columns: Columns, history_length: int) -> None:
        self.workflow = workflow
        self.schema = workflow.schema
        self.history_length = history_length
        self.item_id_op = workflow.op("item_id_idx")
        user_keys = set(workflow.transform(raw_user(self.schema, 0, {}), partial=True))
        present = user_keys | set(item_columns) | {TIMESTAMP}
        # What ``transform(rows, reuse=True)`` would still run on the joined rows, in order.
        self.request_ops = [op for op in workflow.ops if not set(op.outputs) <= present]
        needed = {*self.schema.sparse_columns, DENSE, *self.schema.multi_hot_columns, TIMESTAMP}
        for op in self.request_ops:
            needed.update(op.transform_inputs)
        self.user_keys = sorted(user_keys & needed)
        self.item_columns = ItemRows({k: v for k, v in item_columns.items() if k in needed})

    def user(self, ctx: RequestContext) -> Columns:
        """The request's user, encoded once (cached on the context)."""
        if ctx.encoded_user is None:
            attributes = ctx.user.attributes if ctx.user is not None else {}
            ctx.encoded_user = self.workflow.transform(
                raw_user(self.schema, ctx.user_id, attributes), partial=True
            )
        return ctx.encoded_user

    def query_inputs(self, ctx: RequestContext) -> tuple[np.ndarray, np.ndarray]:
        """``[1, F]`` user id-features and ``[1, history_length]`` history (left-padded with
        0) for the query tower."""
        encoded = self.user(ctx)
        columns = self.schema.user_tower_columns
        features = np.stack([encoded[c] for c in columns], axis=1).astype(np.int64)
        length = self.history_length
        history = np.zeros((1, length), dtype=np.int64)
        recent = np.asarray(ctx.user.recent if ctx.user is not None else [], dtype=np.int64)
        recent = recent[-length:]
        if len(recent):
            ids = self.item_id_op.transform({"item_id": recent})["item_id_idx"]
            history[0, length - len(ids) :] = ids
        return features, history

    def ranking_inputs(self, ctx: RequestContext) -> tuple[np.ndarray, np.ndarray]:
        """``sparse [N, T]`` and ``dense [N, D]`` for the request's candidates."""
        n = len(ctx.candidates)
        encoded = self.user(ctx)
        rows: Columns = {
            k: np.broadcast_to(encoded[k], (n, *encoded[k].shape[1:])) for k in self.user_keys
        }
        rows.update(self.item_columns.gather(ctx.candidates))
        rows[TIMESTAMP] = np.full(n, ctx.timestamp, dtype=np.int64)
        for op in self.request_ops:
            rows.update(op.transform(rows))
        sparse = np.stack([rows[c] for c in self.schema.sparse_columns], axis=1).astype(np.int64)
        return sparse, dense_block(rows, self.schema)
