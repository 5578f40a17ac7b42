"""DLRM: bottom MLP on dense features, one embedding table per sparse feature, pairwise dot
interaction, top MLP. The dense part is a module of its own so that serving can look the
embeddings up elsewhere (the embedding cache) and run only the dense part (ONNX / Triton).
"""

from __future__ import annotations

import torch
from torch import nn

from core.errors import ConfigError
from pipelines.models.embedding import embedding
from pipelines.models.two_tower import _mlp

FLOAT32_BYTES = 4


class DLRMDense(nn.Module):
    """After the embedding lookup: ``(dense [B, n_dense], embedded [B, T, D]) -> logit [B]``."""

    pair_index: torch.Tensor

    def __init__(
        self, n_dense: int, n_tables: int, dim: int, bottom: list[int], top: list[int]
    ) -> None:
        super().__init__()
        self.bottom = nn.Sequential(_mlp([n_dense, *bottom, dim]), nn.ReLU())
        n_vectors = n_tables + 1
        rows, cols = torch.triu_indices(n_vectors, n_vectors, offset=1)
        # positions of the upper-triangle pairs in the flattened [n_vectors, n_vectors] products
        self.register_buffer("pair_index", rows * n_vectors + cols, persistent=False)
        self.top = _mlp([dim + len(rows), *top, 1])

    def forward(self, dense: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        bottom = self.bottom(dense)
        vectors = torch.cat([bottom.unsqueeze(1), embedded], dim=1)
        interactions = vectors @ vectors.transpose(1, 2)
        pairs = interactions.flatten(1).index_select(1, self.pair_index)
        return self.top(torch.cat([bottom, pairs], dim=1)).squeeze(-1)


class DLRM(nn.Module):
    """Embedding tables (widths a multiple of 16 bytes) plus ``DLRMDense``."""

    def __init__(
        self,
        cardinalities: list[int],
        n_dense: int,
        dim: int = 16,
        bottom: tuple[int, ...] = (64,),
        top: tuple[int, ...] = (128, 64),
    ) -> None:
        super().__init__()
        if (dim * FLOAT32_BYTES) % 16:
            raise ConfigError(
                f"embedding dim {dim} is not a multiple of 16 bytes of float32 "
                "(use a multiple of 4)"
            )
        tables = [embedding(n, dim) for n in cardinalities]
        for table in tables:
            nn.init.uniform_(table.weight, -0.05, 0.05)
        self.tables = nn.ModuleList(tables)
        self.dense_part = DLRMDense(n_dense, len(cardinalities), dim, list(bottom), list(top))

    def table_weights(self) -> list[torch.Tensor]:
        """The embedding tables' weights, in sparse-column order."""
        return [table.weight for table in self.tables]  # type: ignore[misc]

    def embed(self, sparse: torch.Tensor) -> torch.Tensor:
        """``sparse [B, T]`` ids -> ``[B, T, D]`` embedding rows."""
        return torch.stack([table(sparse[:, j]) for j, table in enumerate(self.tables)], dim=1)

    def forward(self, sparse: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        return self.dense_part(dense, self.embed(sparse))
