"""Matrix factorisation trained with BPR: the classic collaborative-filtering baseline."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BPRMF(nn.Module):
    """User and item factors; score = dot product."""

    def __init__(self, n_users: int, n_items: int, dim: int = 64) -> None:
        super().__init__()
        self.users = nn.Embedding(n_users, dim, sparse=True)
        self.items = nn.Embedding(n_items, dim, sparse=True)
        nn.init.normal_(self.users.weight, std=0.1)
        nn.init.normal_(self.items.weight, std=0.1)

    def loss(
        self,
        users: torch.Tensor,
        positives: torch.Tensor,
        negatives: torch.Tensor,
        l2: float = 1e-4,
    ) -> torch.Tensor:
        """BPR loss: the positive should outscore a random negative, plus L2 on used factors."""
        u, p, n = self.users(users), self.items(positives), self.items(negatives)
        margin = (u * p).sum(-1) - (u * n).sum(-1)
        regulariser = l2 * (u.pow(2).sum(-1) + p.pow(2).sum(-1) + n.pow(2).sum(-1)).mean()
        return -F.logsigmoid(margin).mean() + regulariser
