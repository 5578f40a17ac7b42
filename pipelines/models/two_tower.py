"""Two-tower retrieval: a user tower (user features + recent history) and an item tower,
with an optional learned per-item logit bias.

Two losses, chosen by catalog size (``pipelines.training.retrieval``):

- full softmax (small catalogs): the item tower encodes the whole catalog once per batch
  and every item the user did not like in training is a negative — the exact objective
  that ranking the full catalog at evaluation asks for;
- in-batch sampled softmax with log-Q correction (large catalogs): every other positive in
  the batch is a negative, and each logit is reduced by the log of its item's sampling
  probability so that popular items are not over-penalised for appearing as negatives
  often. Its cost per sample does not grow with the catalog.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from pipelines.models.embedding import embedding


def _mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _mlp_and_skip(mlp: nn.Module, skip: nn.Module | None, inputs: torch.Tensor) -> torch.Tensor:
    """A tower's MLP, plus (with ``skip``, wide & deep) a linear path from the same inputs:
    a linear function of the embeddings need not be learned through the hidden layer."""
    out = mlp(inputs)
    return out if skip is None else out + skip(inputs)


class QueryTower(nn.Module):
    """User ids ``[B, n_features]`` + history item ids ``[B, L]`` (0 = padding) -> unit vector.

    The history is pooled by its mean; ``skip`` adds a linear path beside the MLP."""

    def __init__(
        self,
        cardinalities: list[int],
        n_items: int,
        feature_dim: int = 16,
        history_dim: int = 32,
        hidden: int = 128,
        out_dim: int = 64,
        skip: bool = False,
    ) -> None:
        super().__init__()
        self.features = nn.ModuleList(embedding(n, feature_dim) for n in cardinalities)
        self.history = embedding(n_items, history_dim, padding_idx=0)
        n_in = feature_dim * len(cardinalities) + history_dim
        self.mlp = _mlp([n_in, hidden, out_dim])
        self.skip = nn.Linear(n_in, out_dim, bias=False) if skip else None

    def forward(self, user_features: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        parts = [table(user_features[:, j]) for j, table in enumerate(self.features)]
        mask = (history > 0).unsqueeze(-1).to(self.history.weight.dtype)
        parts.append((self.history(history) * mask).sum(1) / mask.sum(1).clamp(min=1.0))
        return F.normalize(_mlp_and_skip(self.mlp, self.skip, torch.cat(parts, dim=1)), dim=-1)


class ItemTower(nn.Module):
    """Item id-features ``[B, n_features]`` + dense features ``[B, n_dense]`` -> unit vector.

    With ``bias``, each item also has a learned scalar added to its logits (``bias_of``,
    looked up by the item id in column 0): a popularity prior that a cosine bounded by the
    temperature cannot express."""

    def __init__(
        self,
        cardinalities: list[int],
        n_dense: int,
        feature_dim: int = 32,
        hidden: int = 128,
        out_dim: int = 64,
        bias: bool = False,
        skip: bool = False,
    ) -> None:
        super().__init__()
        self.features = nn.ModuleList(embedding(n, feature_dim) for n in cardinalities)
        self.dense = nn.Linear(n_dense, feature_dim)
        n_in = feature_dim * (len(cardinalities) + 1)
        self.mlp = _mlp([n_in, hidden, out_dim])
        self.skip = nn.Linear(n_in, out_dim, bias=False) if skip else None
        self.bias = embedding(cardinalities[0], 1) if bias else None
        if self.bias is not None:
            nn.init.zeros_(self.bias.weight)

    def forward(self, item_features: torch.Tensor, item_dense: torch.Tensor) -> torch.Tensor:
        parts = [table(item_features[:, j]) for j, table in enumerate(self.features)]
        inputs = torch.cat([*parts, self.dense(item_dense)], dim=1)
        return F.normalize(_mlp_and_skip(self.mlp, self.skip, inputs), dim=-1)

    def bias_of(self, item_features: torch.Tensor) -> torch.Tensor | None:
        """``[B]`` logit bias of each item (None without a bias)."""
        return None if self.bias is None else self.bias(item_features[:, 0])[:, 0]


class ServedQuery(nn.Module):
    """The query tower as served and exported: its unit vector, then (with an item bias) a
    constant 1 that meets each served item vector's last entry, temperature x bias. A dot
    product of served vectors is then the temperature times the trained logit: the same
    order, on the cosine's scale."""

    def __init__(self, query: QueryTower, with_bias: bool) -> None:
        super().__init__()
        self.query = query
        self.with_bias = with_bias

    def forward(self, user_features: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        users = self.query(user_features, history)
        if not self.with_bias:
            return users
        return torch.cat([users, torch.ones_like(users[:, :1])], dim=1)


class TwoTower(nn.Module):
    """Both towers and their two losses (full softmax, in-batch sampled softmax), and the
    vectors they serve (``served_query``, ``served_items``)."""

    def __init__(self, query: QueryTower, item: ItemTower, temperature: float = 0.05) -> None:
        super().__init__()
        self.query = query
        self.item = item
        self.temperature = temperature

    def served_query(self) -> ServedQuery:
        """The query tower as exported (ONNX) and scored against ``served_items``."""
        return ServedQuery(self.query, self.item.bias is not None)

    def served_items(self, item_features: torch.Tensor, item_dense: torch.Tensor) -> torch.Tensor:
        """Item vectors for the ANN: the unit vector, then (with a bias) temperature x bias."""
        items = self.item(item_features, item_dense)
        bias = self.item.bias_of(item_features)
        if bias is None:
            return items
        return torch.cat([items, self.temperature * bias[:, None]], dim=1)

    def logits(
        self,
        users: torch.Tensor,
        item_features: torch.Tensor,
        item_dense: torch.Tensor,
        shift: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[len(users), n_items]``: cosine over the temperature, plus each item's bias and
        ``shift`` (``[n_items]``, e.g. the log-Q correction), added in the same ``addmm``."""
        items = self.item(item_features, item_dense)
        return self._logits(users, items, self.item.bias_of(item_features), shift)

    def _logits(
        self,
        users: torch.Tensor,
        items: torch.Tensor,
        bias: torch.Tensor | None,
        shift: torch.Tensor | None,
    ) -> torch.Tensor:
        if bias is not None:
            shift = bias if shift is None else bias + shift
        scaled = users / self.temperature
        return scaled @ items.T if shift is None else torch.addmm(shift[None, :], scaled, items.T)

    def loss(
        self,
        user_features: torch.Tensor,
        history: torch.Tensor,
        item_features: torch.Tensor,
        item_dense: torch.Tensor,
        item_ids: torch.Tensor,
        log_q: torch.Tensor,
        gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
        offset: int = 0,
    ) -> torch.Tensor:
        """In-batch softmax with log-Q correction; a duplicate of the positive is not a negative.

        Data-parallel, this batch is one rank's share of a global batch: ``gather`` puts
        every rank's item-side rows together (gradients flowing back), and the positives of
        this share sit at ``offset`` among them, so the negatives are the global batch's."""
        users = self.query(user_features, history)
        items = self.item(item_features, item_dense)
        bias = self.item.bias_of(item_features)
        candidates = item_ids
        if gather is not None:
            items, log_q, candidates = gather(items), gather(log_q), gather(item_ids)
            bias = None if bias is None else gather(bias)
        logits = self._logits(users, items, bias, -log_q)
        rows = torch.arange(len(item_ids), device=logits.device)
        duplicate = candidates[None, :] == item_ids[:, None]
        duplicate[rows, rows + offset] = False
        logits = logits.masked_fill(duplicate, float("-inf"))
        return F.cross_entropy(logits, rows + offset)

    def catalog_loss(
        self,
        user_features: torch.Tensor,
        history: torch.Tensor,
        targets: torch.Tensor,
        excluded: torch.Tensor,
        catalog_features: torch.Tensor,
        catalog_dense: torch.Tensor,
    ) -> torch.Tensor:
        """Full softmax over the catalog (item tower inputs ``catalog_*``, row = position).

        ``targets`` are the positives' catalog positions; ``excluded`` ``[B, n_items]`` marks
        the user's other training positives, which are not negatives (the target itself may
        be marked: it is always kept).
        """
        logits = self.logits(self.query(user_features, history), catalog_features, catalog_dense)
        rows = torch.arange(len(targets), device=logits.device)
        excluded = excluded.clone()
        excluded[rows, targets] = False
        logits = logits.masked_fill(excluded, float("-inf"))
        return F.cross_entropy(logits, targets)
