"""Data-parallel training under torchrun: the process group, who leads, how the others follow.

A launcher (``torchrun``, or anything that sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``) starts N copies of the same command. In
``lead_or_follow``, rank 0 runs the command exactly as a single process would (data
preparation, the baselines, evaluation, export, the retrain job's gate and registry). The
other ranks only ``follow``: each time rank 0 reaches a data-parallel training step it calls
``run_on_all``, which tells the followers to run the same step beside it; inside that step
``replicas()`` says which share of each batch a rank trains on. Decisions (validation
metrics, early stopping) are taken on rank 0 and broadcast (``decided``), so every rank
stops after the same epoch.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from core.errors import CascadeError, ConfigError

T = TypeVar("T")

TIMEOUT_ENV = "CASCADE_DIST_TIMEOUT_S"
# How long a rank waits for the others in a collective of a training step (rank 0's
# validation included: the others wait for its metrics).
DEFAULT_TIMEOUT_S = 1800.0
# How long a follower waits for rank 0's next step: rank 0 prepares the data, trains the
# baselines and exports alone meanwhile. A rank that dies closes its connections, so the
# others hear of it at once; this only bounds a rank 0 that hangs between steps.
IDLE_TIMEOUT = timedelta(days=1)


@dataclass(frozen=True)
class Replicas:
    """Where this process stands in the data-parallel step it runs: ``rank`` of ``world``."""

    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        """Rank 0: the one that validates, reports and saves."""
        return self.rank == 0

    @property
    def parallel(self) -> bool:
        return self.world > 1

    def share(self, global_batch: int, option: str) -> int:
        """The per-rank batch of a global batch (the option's value: the batch a single
        process would train on); a ``ConfigError`` naming the option unless it divides."""
        if global_batch % self.world:
            raise ConfigError(
                f"{option} {global_batch} is the global batch, split evenly over "
                f"{self.world} ranks: use a multiple of {self.world}"
            )
        return global_batch // self.world


SINGLE = Replicas()


class _Session:
    """This process's view of the group: its place, whether it runs a step on every rank,
    and (on rank 0) whether the followers are idle, waiting in ``follow`` for a step."""

    def __init__(self) -> None:
        self.place = SINGLE
        self.commands: Any = None  # the group rank 0 hands steps over in (IDLE_TIMEOUT)
        self.in_step = False
        self.followers_idle = True


_session = _Session()
_STOP = "stop"


def launched() -> Replicas:
    """The place the launcher gave this process (``RANK``/``WORLD_SIZE``; 0 of 1 without)."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
    except ValueError as error:
        raise ConfigError(f"RANK and WORLD_SIZE must be integers: {error}") from error
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(f"RANK {rank} is not in 0..WORLD_SIZE-1 (WORLD_SIZE {world})")
    return Replicas(rank, world)


def timeout() -> timedelta:
    """The training steps' collective timeout (``CASCADE_DIST_TIMEOUT_S``, default 30 min)."""
    raw = os.environ.get(TIMEOUT_ENV, str(DEFAULT_TIMEOUT_S))
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ConfigError(f"{TIMEOUT_ENV} must be a positive number of seconds, got {raw!r}")
    return timedelta(seconds=seconds)


def is_main() -> bool:
    """Whether this process runs the command itself (rank 0, or the only process)."""
    return _session.place.main


def replicas() -> Replicas:
    """The data-parallel place of the step being run: this rank of the group inside
    ``run_on_all`` (on every rank), a single replica anywhere else (rank 0's baselines,
    evaluation and export run alone)."""
    return _session.place if _session.in_step else SINGLE


@contextlib.contextmanager
def session() -> Iterator[Replicas]:
    """The process group of a launched job, for the duration of the block.

    With ``WORLD_SIZE`` > 1: gloo on the CPU, NCCL on a GPU (this rank's ``LOCAL_RANK``
    device), a training step's collectives bounded by ``timeout()``, a follower's wait for
    the next step by ``IDLE_TIMEOUT``; destroyed on leaving. An error of the
    group (a rank died, a collective timed out) becomes one ``CascadeError`` saying so.
    Alone: nothing.
    """
    place = launched()
    if not place.parallel or dist.is_initialized():
        yield place
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl", timeout=timeout())
    else:
        dist.init_process_group("gloo", timeout=timeout())
    _session.place, _session.in_step, _session.followers_idle = place, False, True
    try:
        _session.commands = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
        yield place
    except (dist.DistError, RuntimeError) as error:
        if not _collective_failure(error):
            raise
        raise CascadeError(
            f"distributed training failed on rank {place.rank} of {place.world}: "
            f"{_first_line(error)} (another rank probably died or stopped answering; "
            "torchrun's summary names the first one that failed)"
        ) from error
    finally:
        _session.place, _session.commands = SINGLE, None
        dist.destroy_process_group()


def lead_or_follow(command: Callable[[], int]) -> int:
    """A command under the launcher: ``command()`` on rank 0 (its exit code), on the other
    ranks ``follow()`` (exit code 0); alone, just ``command()``. Followers waiting for a
    step when rank 0 finishes (also when it failed between steps) are released; ones inside
    a step with it are left to fail in their next collective."""
    with session() as place:
        if not place.parallel:
            return command()
        if not place.main:
            follow()
            return 0
        try:
            return command()
        finally:
            if _session.followers_idle:
                _broadcast((_STOP, ()), _session.commands)


def _collective_failure(error: BaseException) -> bool:
    """Whether ``error`` came out of the process group: a ``DistError``, or the plain
    RuntimeError gloo raises when a peer's connection closes or a wait times out (from a
    collective, or from DDP's all-reduce inside ``backward``)."""
    if isinstance(error, dist.DistError) or "gloo" in str(error):
        return True
    trace = error.__traceback__
    while trace is not None:
        if f"torch{os.sep}distributed{os.sep}" in trace.tb_frame.f_code.co_filename:
            return True
        trace = trace.tb_next
    return False


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _broadcast(value: Any, group: Any = None) -> Any:
    """Rank 0's ``value`` on every rank (pickled), in ``group`` (default: the whole job's)."""
    box = [value if is_main() else None]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def run_on_all(step: Callable[..., T], *args: Any, **main_only: Any) -> T:
    """``step(*args)`` on every rank of the job; returns rank 0's result.

    ``step`` must be a module-level function (the followers receive it by reference) and
    ``args`` picklable; ``main_only`` keyword arguments (a report callback) are passed on
    rank 0 alone. Alone, or called inside a step: a plain call."""
    if not dist.is_initialized() or _session.in_step or not _session.place.parallel:
        return step(*args, **main_only)
    _broadcast((step, args), _session.commands)
    _session.followers_idle = False
    result = _in_step(step, args, main_only)
    _session.followers_idle = True  # they are back in follow(), waiting for the next step
    return result


def _in_step(step: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    _session.in_step = True
    try:
        return step(*args, **kwargs)
    finally:
        _session.in_step = False


def follow() -> None:
    """On a follower: run each step rank 0 hands over (``run_on_all``) until it is done."""
    while True:
        step, args = _broadcast(None, _session.commands)
        if step == _STOP:
            return
        _in_step(step, args, {})


def decided(compute: Callable[[], T], place: Replicas) -> T:
    """``compute()`` run on rank 0 only, its (picklable) result on every rank."""
    if not place.parallel:
        return compute()
    result: T = _broadcast(compute() if place.main else None)
    return result


def mean_over(value: float, place: Replicas) -> float:
    """The mean of ``value`` over the ranks (one all-reduce; ``value`` alone)."""
    if not place.parallel:
        return value
    total = torch.tensor([value], dtype=torch.float64, device=_collective_device())
    dist.all_reduce(total)
    return float(total.item()) / place.world


def _collective_device() -> torch.device:
    return torch.device("cuda") if dist.get_backend() == "nccl" else torch.device("cpu")


def gather_rows(tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's ``tensor`` (the same shape on each) concatenated along dim 0 in rank
    order; gradients flow back to each rank's own rows (summed over the ranks' losses)."""
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(tensor), dim=0)


class _Objective(nn.Module):
    """``loss_fn`` as a module's forward over ``model``'s parameters, for DDP to wrap."""

    def __init__(self, model: nn.Module, loss_fn: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, *batch: Any) -> torch.Tensor:
        return self.loss_fn(*batch)


def data_parallel(
    model: nn.Module, loss_fn: Callable[..., torch.Tensor]
) -> Callable[..., torch.Tensor]:
    """``loss_fn`` through DistributedDataParallel: its backward averages every gradient of
    ``model`` over the ranks (sparse embedding gradients too, as sparse all-reduces), and
    the wrapper starts every rank from rank 0's weights."""
    from torch.nn.parallel import DistributedDataParallel

    where = next(model.parameters()).device
    wrapped = DistributedDataParallel(
        _Objective(model, loss_fn),
        device_ids=[where] if where.type == "cuda" else None,
        forward_sync_buffers=False,  # no buffer changes in training (no batch norm)
    )
    return wrapped
