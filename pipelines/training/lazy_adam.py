"""Lazy Adam for embedding tables with sparse gradients: only the rows a batch touched move.

The arithmetic is ``torch.optim.SparseAdam``'s (each touched row's moments decay and take
the gradient, the step counts every call, rows the batch did not touch keep their moments),
done with row gathers and row copies on the touched rows instead of sparse-tensor
additions. For a 1M-row table and a batch touching 10k rows, SparseAdam's ``add_`` of sparse
tensors and its ``sparse_mask`` lookups cost about 2x this (``bench/sparse_optimizer.py``),
and the two-tower's step at 1M items spent a quarter of its time there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch


class LazyAdam(torch.optim.Optimizer):
    """Adam on parameters whose gradients are sparse (``nn.Embedding(sparse=True)``)."""

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        if lr <= 0 or eps <= 0 or not all(0.0 <= beta < 1.0 for beta in betas):
            raise ValueError(f"LazyAdam needs lr > 0, eps > 0, betas in [0, 1): {lr} {eps} {betas}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps})

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                if not param.grad.is_sparse:
                    raise RuntimeError("LazyAdam takes sparse gradients; use Adam for dense ones")
                grad = param.grad.coalesce()  # a row the batch looked up twice: summed once
                rows, values = grad.indices()[0], grad.values()
                if values.numel() == 0:
                    continue
                state = self.state[param]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(param)
                    state["exp_avg_sq"] = torch.zeros_like(param)
                state["step"] += 1
                step = state["step"]
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                mean = exp_avg.index_select(0, rows).lerp_(values, 1.0 - beta1)
                square = exp_avg_sq.index_select(0, rows).mul_(beta2)
                square.addcmul_(values, values, value=1.0 - beta2)
                exp_avg.index_copy_(0, rows, mean)
                exp_avg_sq.index_copy_(0, rows, square)
                size = group["lr"] * math.sqrt(1.0 - beta2**step) / (1.0 - beta1**step)
                moved = param.index_select(0, rows)
                moved.addcdiv_(mean, square.sqrt_().add_(group["eps"]), value=-size)
                param.index_copy_(0, rows, moved)  # rows are unique: a copy, not an add
