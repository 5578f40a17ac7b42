"""The shared training loop: seeds, device, mixed precision on GPU, progress bars."""

from __future__ import annotations

import copy
import random
import sys
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from tqdm import tqdm


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and torch for reproducible runs."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def train_epochs(
    model: torch.nn.Module,
    epoch_batches: Callable[[int], Iterable[tuple[Any, ...]]],
    loss_fn: Callable[..., torch.Tensor],
    epochs: int,
    lr: float,
    name: str,
    weight_decay: float = 0.0,
    after_epoch: Callable[[int], dict[str, float]] | None = None,
    keep_best: str | None = None,
    batches_per_epoch: int | None = None,
    quiet: bool = False,
    report: Callable[[str], None] | None = None,
) -> list[dict[str, float]]:
    """Train ``model`` over ``epoch_batches(epoch)``; one record per epoch (mean loss + extras).

    Embedding tables with sparse gradients (``nn.Embedding(sparse=True)``) are updated by
    SparseAdam, only in the rows a batch touched (a million-row table costs what the batch
    uses); every other parameter by Adam.

    ``keep_best=metric`` restores, at the end, the model's weights from the epoch with the
    highest ``metric`` among ``after_epoch``'s outputs (early stopping's choice).
    On a GPU the forward pass runs under bfloat16 autocast (mixed precision).

    ``report`` receives the one-line summary of each epoch instead of ``tqdm.write`` (a job
    logging its progress); with it, the progress bar is shown only on a terminal.
    """
    best_value, best_state = -float("inf"), None
    sparse = [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding) and m.sparse]
    sparse_ids = {id(p) for p in sparse}
    dense = [p for p in model.parameters() if id(p) not in sparse_ids]
    optimizers: list[torch.optim.Optimizer] = []
    if dense:
        optimizers.append(torch.optim.Adam(dense, lr=lr, weight_decay=weight_decay))
    if sparse:
        optimizers.append(torch.optim.SparseAdam(sparse, lr=lr))
    use_amp = torch.cuda.is_available()
    history: list[dict[str, float]] = []
    for epoch in range(epochs):
        total, count = 0.0, 0
        bar = tqdm(
            epoch_batches(epoch),
            desc=f"{name} epoch {epoch + 1}/{epochs}",
            leave=False,
            total=batches_per_epoch,
            disable=quiet or (report is not None and not sys.stderr.isatty()),
            unit="batch",
            mininterval=0.5,
        )
        for batch in bar:
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_amp):
                loss = loss_fn(*batch)
            for optimizer in optimizers:
                optimizer.zero_grad(set_to_none=True)
            loss.backward()
            for optimizer in optimizers:
                optimizer.step()
            total += float(loss.detach())
            count += 1
            bar.set_postfix(loss=f"{total / count:.4f}")
        record = {"epoch": epoch + 1, "loss": total / max(count, 1)}
        if after_epoch is not None:
            record.update(after_epoch(epoch))
        history.append(record)
        if keep_best is not None and record[keep_best] > best_value:
            best_value = record[keep_best]
            best_state = copy.deepcopy(model.state_dict())
        if not quiet or report is not None:
            extras = " ".join(f"{k}={v:.4f}" for k, v in record.items() if k not in ("epoch",))
            (report or tqdm.write)(f"{name} epoch {epoch + 1}/{epochs}: {extras}")
    if best_state is not None:
        model.load_state_dict(best_state)
    return history
