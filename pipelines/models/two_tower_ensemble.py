"""An ensemble of two-towers served as one two-tower.

K two-towers trained apart (each its own initialisation and batch order) disagree where the
data says little, and the sum of their logits ranks better than any one of them (on
MovieLens-100K: docs/benchmarks/retriever_variants.md). The sum needs no
second model at serving time: each member's served query and item vectors are
concatenated, and the dot product of the concatenations is the sum of the members' dot
products, temperature x the summed logits. One query tower (ONNX) and one ANN index over
K times wider vectors serve the whole ensemble.
"""

from __future__ import annotations

import torch
from torch import nn

from pipelines.models.two_tower import ServedQuery, TwoTower


class EnsembleQuery(nn.Module):
    """The members' served query vectors, concatenated in member order."""

    def __init__(self, queries: list[ServedQuery]) -> None:
        super().__init__()
        self.queries = nn.ModuleList(queries)

    def forward(self, user_features: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        return torch.cat([query(user_features, history) for query in self.queries], dim=1)


class TwoTowerEnsemble(nn.Module):
    """Two or more ``TwoTower`` members with one temperature; scored as the sum of their
    logits through ``served_query`` and ``served_items``."""

    def __init__(self, members: list[TwoTower]) -> None:
        super().__init__()
        if len(members) < 2:
            raise ValueError(f"an ensemble needs at least 2 members, got {len(members)}")
        temperatures = {member.temperature for member in members}
        if len(temperatures) > 1:
            raise ValueError(f"the members' temperatures differ: {sorted(temperatures)}")
        self.members = nn.ModuleList(members)
        self.temperature = members[0].temperature

    def towers(self) -> list[TwoTower]:
        """The members, typed."""
        return [member for member in self.members if isinstance(member, TwoTower)]

    def served_query(self) -> EnsembleQuery:
        """One query vector: the members' served queries side by side."""
        return EnsembleQuery([member.served_query() for member in self.towers()])

    def served_items(self, item_features: torch.Tensor, item_dense: torch.Tensor) -> torch.Tensor:
        """One item vector: the members' served items side by side."""
        return torch.cat(
            [member.served_items(item_features, item_dense) for member in self.towers()], dim=1
        )
