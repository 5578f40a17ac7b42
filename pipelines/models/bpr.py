"""Matrix factorisation trained with BPR: the classic collaborative-filtering baseline."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipelines.models.embedding import embedding

INIT_STD = 0.01  # the usual N(0, 0.01) initialisation of MF factors


class BPRMF(nn.Module):
    """User and item factors, initialised from N(0, ``INIT_STD``); score = dot product."""

    def __init__(self, n_users: int, n_items: int, dim: int = 64) -> None:
        super().__init__()
        self.users = embedding(n_users, dim)
        self.items = embedding(n_items, dim)
        nn.init.normal_(self.users.weight, std=INIT_STD)
        nn.init.normal_(self.items.weight, std=INIT_STD)

    def loss(
        self,
        users: torch.Tensor,
        positives: torch.Tensor,
        negatives: torch.Tensor,
        l2: float = 1e-5,
    ) -> torch.Tensor:
        """BPR loss: the positive should outscore a sampled negative, plus L2 on used factors."""
        u, p, n = self.users(users), self.items(positives), self.items(negatives)
        margin = (u * p).sum(-1) - (u * n).sum(-1)
        regulariser = l2 * (u.pow(2).sum(-1) + p.pow(2).sum(-1) + n.pow(2).sum(-1)).mean()
        return -F.logsigmoid(margin).mean() + regulariser
