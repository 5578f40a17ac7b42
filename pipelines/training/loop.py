"""The shared training loop: seeds, device, mixed precision, early stopping, progress.

Progress: a live bar per epoch only when stderr is a terminal; otherwise (a log file, CI, a
pipe) nothing per batch, and always one summary line per epoch.
"""

from __future__ import annotations

import copy
import functools
import queue
import random
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from pipelines.training.distributed import SINGLE, Replicas, data_parallel, decided, mean_over
from pipelines.training.lazy_adam import LazyAdam


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and torch for reproducible runs."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def device() -> torch.device:
    """Where the trainers put their models: the GPU when there is one, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def on_device(value: Any, target: torch.device) -> Any:
    """``value`` (a tensor, or a tuple, list or dict of them) on ``target`` (no copy when it
    is there already)."""
    if isinstance(value, torch.Tensor):
        return value.to(target, non_blocking=True)
    if isinstance(value, dict):
        return {key: on_device(item, target) for key, item in value.items()}
    if isinstance(value, tuple | list):
        return type(value)(on_device(item, target) for item in value)
    return value


def pinned(value: Any) -> Any:
    """``value`` (a tensor, or a tuple, list or dict of them) in page-locked host memory, so
    that its copy to the GPU is asynchronous."""
    if isinstance(value, torch.Tensor):
        return value.pin_memory()
    if isinstance(value, dict):
        return {key: pinned(item) for key, item in value.items()}
    if isinstance(value, tuple | list):
        return type(value)(pinned(item) for item in value)
    return value


PREFETCH_DEPTH = 2


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


def read_ahead(
    items: Iterable[Any], depth: int, prepare: Callable[[Any], Any] = lambda item: item
) -> Iterator[Any]:
    """``prepare(item)`` for each of ``items``, in order, computed by a background thread up
    to ``depth`` items ahead of the consumer. An error raised by ``items`` or ``prepare`` is
    raised in the consumer at its place in the order; closing the iterator early stops the
    thread (after the item it is building)."""
    ready: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stopped = threading.Event()

    def offer(item: Any) -> bool:
        while not stopped.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not offer(prepare(item)):
                    return
            offer(_END)
        except BaseException as error:  # handed to the consumer, which raises it
            offer(_Failed(error))

    worker = threading.Thread(target=produce, name="cascade-read-ahead", daemon=True)
    worker.start()
    try:
        while True:
            item = ready.get()
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stopped.set()
        worker.join()


def prefetched(batches: Iterable[Any], target: torch.device) -> Iterator[Any]:
    """The batches a training step on ``target`` consumes.

    On a GPU they are built ``PREFETCH_DEPTH`` ahead by a background thread, in pinned
    memory: building the next batch overlaps the current step (whose kernels run
    asynchronously), and the copy to the device does not wait. At large batches a serial
    loader had become the GPU's bottleneck (``bench/training.py --device cuda``). On the CPU
    the batches are consumed as they are built: the step and the loader would share the same
    cores."""
    if target.type != "cuda":
        return iter(batches)
    return read_ahead(batches, PREFETCH_DEPTH, pinned)


@dataclass(frozen=True)
class EarlyStopping:
    """Validation schedule and model selection.

    Attributes:
        validate: epoch index -> validation metrics (higher is better for ``monitor``).
        monitor: the metric that selects the epoch whose weights are kept.
        patience: stop after this many validations without improvement (None: never stop).
        every: validate every ``every`` epochs (and always after the last one).
    """

    validate: Callable[[int], dict[str, float]]
    monitor: str
    patience: int | None = None
    every: int = 1


def show_bar(quiet: bool) -> bool:
    """A live progress bar only on a terminal (no carriage-return redraws in logs)."""
    return not quiet and sys.stderr.isatty()


def best_record(history: list[dict[str, float]], monitor: str) -> dict[str, float] | None:
    """The epoch record with the highest ``monitor`` (the first on ties), if any was validated."""
    scored = [r for r in history if monitor in r]
    return max(scored, key=lambda r: r[monitor]) if scored else None


def make_optimizers(model: torch.nn.Module, lr: float, weight_decay: float) -> list[Any]:
    """Adam for dense parameters, ``LazyAdam`` (SparseAdam's arithmetic, faster) for sparse
    embedding tables.

    The dense Adam is the fused one (one kernel over every parameter, on the CPU too). On a
    CPU, ``torch.optim.Adam`` otherwise runs its per-tensor loop, a dozen ops per parameter,
    a large share of each step (figures: docs/benchmarks/training.md)."""
    sparse = [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding) and m.sparse]
    sparse_ids = {id(p) for p in sparse}
    dense = [p for p in model.parameters() if id(p) not in sparse_ids]
    optimizers: list[torch.optim.Optimizer] = []
    if dense:
        optimizers.append(torch.optim.Adam(dense, lr=lr, weight_decay=weight_decay, fused=True))
    if sparse:
        optimizers.append(LazyAdam(sparse, lr=lr))
    return optimizers


def make_step(
    model: torch.nn.Module,
    loss_fn: Callable[[Any], torch.Tensor],
    lr: float,
    weight_decay: float = 0.0,
) -> Callable[[Any], torch.Tensor]:
    """One optimisation step on a batch: moved to the model's device, the loss under
    bfloat16 autocast on a GPU, every optimizer (``make_optimizers``) stepped. Returns the
    detached loss, left on the device (reading it would wait for the GPU)."""
    optimizers = make_optimizers(model, lr, weight_decay)
    target = model_device(model)
    use_amp = target.type == "cuda"

    def step(batch: Any) -> torch.Tensor:
        batch = on_device(batch, target)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_amp):
            loss = loss_fn(batch)
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for optimizer in optimizers:
            optimizer.step()
        return loss.detach()

    return step


def train_epochs(
    model: torch.nn.Module,
    epoch_batches: Callable[[int], Iterable[tuple[Any, ...]]],
    loss_fn: Callable[..., torch.Tensor],
    epochs: int,
    lr: float,
    name: str,
    weight_decay: float = 0.0,
    stopping: EarlyStopping | None = None,
    batches_per_epoch: int | None = None,
    quiet: bool = False,
    report: Callable[[str], None] | None = None,
    replicas: Replicas = SINGLE,
) -> list[dict[str, float]]:
    """Train ``model`` over ``epoch_batches(epoch)``; one record per epoch (mean loss + extras).

    Embedding tables with sparse gradients (``nn.Embedding(sparse=True)``) are updated by
    ``LazyAdam``, only in the rows a batch touched (a million-row table costs what the batch
    uses); every other parameter by Adam. Training runs where the model is: each batch is
    moved to the model's device, and on a GPU the forward pass runs under bfloat16 autocast
    (mixed precision).

    With ``stopping``, the model is validated on its schedule, training stops once
    ``patience`` validations in a row did not improve ``monitor``, and the weights of the
    best validated epoch are restored at the end (keep-best). The record of that epoch has
    ``best = 1``.

    ``report`` receives the one-line summary of each epoch (default: print); ``quiet``
    silences both the lines and the bar.

    Data-parallel (``replicas.world`` > 1, every rank calling this with its own share of
    each batch): the model is wrapped in DistributedDataParallel, so each step applies the
    gradient of the global batch on every rank. Rank 0 alone validates (the others receive
    its metrics, so all stop after the same epoch), reports and keeps the best weights; the
    epoch's loss is the mean over the ranks.
    """
    objective = data_parallel(model, loss_fn) if replicas.parallel else loss_fn
    step = make_step(model, lambda batch: objective(*batch), lr, weight_decay)
    target = model_device(model)
    emit = report or print
    quiet = quiet or not replicas.main
    history: list[dict[str, float]] = []
    best_value, best_state, best_index, stale = -float("inf"), None, -1, 0
    for epoch in range(epochs):
        total, count = 0.0, 0
        bar = tqdm(
            prefetched(epoch_batches(epoch), target),
            desc=f"{name} epoch {epoch + 1}/{epochs}",
            leave=False,
            total=batches_per_epoch,
            disable=not show_bar(quiet),
            unit="batch",
            mininterval=0.5,
        )
        running = torch.zeros((), device=target)  # summed where the loss is: no sync per step
        started = time.perf_counter()
        for batch in bar:
            running += step(batch).float()
            count += 1
            if not bar.disable:
                bar.set_postfix(loss=f"{float(running) / count:.4f}", refresh=False)
        total = float(running)
        trained = time.perf_counter()
        timing = f"(trained in {trained - started:.0f} s"
        loss = mean_over(total / max(count, 1), replicas)
        record: dict[str, float] = {"epoch": epoch + 1, "loss": loss}
        last = epoch == epochs - 1
        if stopping is not None and ((epoch + 1) % stopping.every == 0 or last):
            record.update(decided(functools.partial(stopping.validate, epoch), replicas))
            timing += f", validated in {time.perf_counter() - trained:.0f} s"
            if record[stopping.monitor] > best_value:
                best_value, best_index, stale = record[stopping.monitor], len(history), 0
                if replicas.main:  # the other ranks' weights are not used after training
                    best_state = copy.deepcopy(model.state_dict())
            else:
                stale += 1
        history.append(record)
        if not quiet:
            extras = " ".join(f"{k}={v:.4f}" for k, v in record.items() if k != "epoch")
            emit(f"{name} epoch {epoch + 1}/{epochs}: {extras} {timing})")
        if stopping is not None and stopping.patience is not None and stale >= stopping.patience:
            if not quiet:
                emit(
                    f"{name}: stopped early after epoch {epoch + 1} ({stopping.patience} "
                    f"validations without a better {stopping.monitor})"
                )
            break
    if best_index >= 0:
        if best_state is not None:
            model.load_state_dict(best_state)
        history[best_index]["best"] = 1.0
    return history
