"""EASE (Steck, 2019): a linear item-item model with a closed-form solution.

``B = argmin ||X - XB||^2 + lambda ||B||^2`` subject to ``diag(B) = 0``, with ``X`` the
binary user x item matrix of training positives. With ``P = (X^T X + lambda I)^-1``:
``B = -P / diag(P)`` (column-wise), zero diagonal. A user's scores are ``x_u B``.
It is one of the strongest simple baselines for top-k recommendation, and needs an
items x items matrix, so it is trained only where the catalog allows.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from core.errors import ConfigError

EXACT_ITEMS = 5_000  # up to this catalog size EASE is solved in float64, above in float32


def gram(pairs: np.ndarray, n_users: int, n_items: int) -> torch.Tensor:
    """``X^T X`` (dense ``[n_items, n_items]``) of the binary matrix of ``pairs``."""
    keys = np.unique(pairs[:, 0].astype(np.int64) * n_items + pairs[:, 1])
    indices = torch.from_numpy(np.stack([keys // n_items, keys % n_items]))
    dtype = torch.float64 if n_items <= EXACT_ITEMS else torch.float32
    ones = torch.ones(len(keys), dtype=dtype)
    with warnings.catch_warnings():  # torch's "beta" notes on sparse tensors
        warnings.simplefilter("ignore", UserWarning)
        x = torch.sparse_coo_tensor(indices, ones, (n_users, n_items)).coalesce()
        return torch.sparse.mm(x.t().coalesce(), x).to_dense()


class EASE:
    """The fitted item-item weights ``B`` and the users' training rows."""

    def __init__(self, weights: torch.Tensor, train: np.ndarray, n_users: int) -> None:
        self.weights = weights.float()
        order = np.argsort(train[:, 0], kind="stable")
        self.items = train[order, 1]  # training items grouped by user
        self.bounds = np.searchsorted(train[order, 0], np.arange(n_users + 1))

    @classmethod
    def fit(cls, gram_matrix: torch.Tensor, l2: float, train: np.ndarray, n_users: int) -> EASE:
        """Solve the closed form for one ``l2`` (the regularisation lambda)."""
        if l2 <= 0:
            raise ConfigError(f"EASE needs a positive l2, got {l2}")
        regularised = gram_matrix.clone()
        regularised.diagonal().add_(l2)
        inverse = torch.linalg.inv(regularised)
        weights = -inverse / inverse.diagonal()[None, :]
        weights.diagonal().zero_()
        return cls(weights, train, n_users)

    def scores(self, users: np.ndarray) -> np.ndarray:
        """Scores over every item for ``users`` (positions), ``[len(users), n_items]``."""
        n_items = self.weights.shape[0]
        starts, ends = self.bounds[users], self.bounds[np.asarray(users) + 1]
        lengths = ends - starts
        row = np.repeat(np.arange(len(users)), lengths)
        offsets = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        rows = np.zeros((len(users), n_items), dtype=np.float32)
        rows[row, self.items[np.repeat(starts, lengths) + offsets]] = 1.0
        return (torch.from_numpy(rows) @ self.weights).numpy()
