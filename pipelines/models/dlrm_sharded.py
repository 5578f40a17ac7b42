"""DLRM with its tables in one TorchRec ``EmbeddingBagCollection``, ready to be sharded.

The same model as ``pipelines.models.dlrm.DLRM``: each sparse feature holds one id per row, so
a bag of one id pooled by sum is that id's row, and the same ``DLRMDense`` runs after the
lookup. Only the tables' container differs, which lets ``DistributedModelParallel`` spread
them over ranks. TorchRec is imported here at module level: only the sharded trainer imports
this module, never the single-process path.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, PoolingType

from pipelines.models.dlrm import DLRM, DLRMDense

BAGS = "ebc.embedding_bags"  # where the tables' weights sit in this model's state_dict


def table_name(column: int) -> str:
    """The TorchRec table of the ``column``-th sparse column (also what the planner plans)."""
    return f"table_{column}"


def feature_name(column: int) -> str:
    return f"sparse_{column}"


def bag_key(column: int) -> str:
    """The state_dict key of the ``column``-th table in ``BagDLRM`` (and sharded under DMP)."""
    return f"{BAGS}.{table_name(column)}.weight"


def dlrm_key(column: int) -> str:
    """The same table's key in a plain ``DLRM`` state_dict (the export format)."""
    return f"tables.{column}.weight"


class BagDLRM(nn.Module):
    """``(sparse [B, T] ids, dense [B, n_dense]) -> logit [B]``, tables in one EBC.

    Args:
        cardinalities: rows of each table, in sparse-column order.
        dim: embedding width (the same for every table, as in ``DLRM``).
        dense_part: the layers after the lookup (taken as is, not copied).
        device: where the tables are created (``meta`` defers their memory to sharding).
    """

    def __init__(
        self,
        cardinalities: list[int],
        dim: int,
        dense_part: DLRMDense,
        device: torch.device | None = None,
    ) -> None:
        super().__init__()
        self.features = [feature_name(j) for j in range(len(cardinalities))]
        self.dim = dim
        self.ebc = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(
                    name=table_name(j),
                    embedding_dim=dim,
                    num_embeddings=rows,
                    feature_names=[feature_name(j)],
                    pooling=PoolingType.SUM,
                )
                for j, rows in enumerate(cardinalities)
            ],
            device=device,
        )
        self.dense_part = dense_part

    def forward(self, sparse: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        batch, n_tables = sparse.shape
        ids = KeyedJaggedTensor(
            keys=self.features,
            values=sparse.t().reshape(-1),  # feature-major: every row's id of feature 0 first
            lengths=torch.ones(n_tables * batch, dtype=torch.int32, device=sparse.device),
        )
        # by name: a sharded collection's output lists the features in its shards' order
        pooled = self.ebc(ids).to_dict()
        return self.dense_part(dense, torch.stack([pooled[f] for f in self.features], dim=1))

    @classmethod
    def from_dlrm(cls, dlrm: DLRM, device: torch.device | None = None) -> BagDLRM:
        """A ``BagDLRM`` with ``dlrm``'s architecture. On a real device it also takes the
        weights; on ``meta`` only the shapes (load them after sharding: ``load_dlrm_state``
        in ``pipelines.training.sharded``)."""
        weights = dlrm.table_weights()
        model = cls(
            [w.shape[0] for w in weights],
            weights[0].shape[1],
            copy.deepcopy(dlrm.dense_part),
            device=device,
        )
        if device is None or device.type != "meta":
            model.load_state_dict(to_bag_state(dlrm.state_dict(), len(weights)))
        return model


def to_bag_state(state: dict[str, torch.Tensor], n_tables: int) -> dict[str, torch.Tensor]:
    """A plain ``DLRM`` state_dict renamed to ``BagDLRM``'s keys (same tensors)."""
    renamed = {bag_key(j): state[dlrm_key(j)] for j in range(n_tables)}
    renamed.update({k: v for k, v in state.items() if k.startswith("dense_part.")})
    return renamed


def to_dlrm_state(state: dict[str, torch.Tensor], n_tables: int) -> dict[str, torch.Tensor]:
    """A ``BagDLRM`` state_dict (full tensors) renamed to the plain ``DLRM``'s keys."""
    renamed = {dlrm_key(j): state[bag_key(j)] for j in range(n_tables)}
    renamed.update({k: v for k, v in state.items() if k.startswith("dense_part.")})
    return renamed
