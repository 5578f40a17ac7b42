"""The shared training loop: one line per epoch off a terminal, early stopping, keep-best."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest
import torch

from pipelines.training.loop import EarlyStopping, best_record, make_step, train_epochs


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(2, 1)


def _batches(_: int) -> list[tuple[torch.Tensor]]:
    return [(torch.randn(8, 2),) for _ in range(50)]


def _loss(model: torch.nn.Module):  # type: ignore[no-untyped-def]
    return lambda x: model(x).pow(2).mean()


def test_a_captured_run_writes_one_line_per_epoch_and_no_bar() -> None:
    script = textwrap.dedent(
        """
        import torch
        from pipelines.training.loop import train_epochs
        model = torch.nn.Linear(2, 1)
        batches = lambda _: [(torch.randn(4, 2),) for _ in range(300)]
        train_epochs(model, batches, lambda x: model(x).pow(2).mean(), 4, 1e-2, "toy",
                     batches_per_epoch=300)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [f"toy epoch {e}/4" for e in range(1, 5)]
    assert "\r" not in done.stdout + done.stderr  # no progress-bar redraws in a log
    assert done.stderr == ""


def test_report_gets_the_lines_and_quiet_silences_them() -> None:
    lines: list[str] = []
    model = _model()
    train_epochs(model, _batches, _loss(model), 3, 1e-2, "toy", report=lines.append)
    assert len(lines) == 3 and lines[0].startswith("toy epoch 1/3: loss=")
    assert re.search(r"\(trained in \d+ s\)$", lines[0])  # how long the epoch took
    lines.clear()
    train_epochs(model, _batches, _loss(model), 3, 1e-2, "toy", report=lines.append, quiet=True)
    assert lines == []


def test_training_stops_after_patience_validations_without_improvement() -> None:
    scores = iter([0.1, 0.5, 0.4, 0.3, 0.2, 0.9, 0.9])
    lines: list[str] = []
    model = _model()
    history = train_epochs(
        model,
        _batches,
        _loss(model),
        7,
        1e-2,
        "toy",
        stopping=EarlyStopping(lambda _: {"valid": next(scores)}, "valid", patience=3),
        report=lines.append,
    )
    assert [r["epoch"] for r in history] == [1, 2, 3, 4, 5]  # epochs 3, 4, 5 did not improve
    assert "stopped early after epoch 5" in lines[-1]
    assert re.search(r"\(trained in \d+ s, validated in \d+ s\)$", lines[0])
    best = best_record(history, "valid")
    assert best is not None and best["epoch"] == 2 and best.get("best") == 1.0


def test_the_best_validated_weights_are_restored() -> None:
    model = _model()
    snapshots: list[torch.Tensor] = []

    def validate(epoch: int) -> dict[str, float]:
        snapshots.append(model.weight.detach().clone())
        return {"valid": [0.2, 0.8, 0.1][epoch]}

    train_epochs(
        model,
        _batches,
        _loss(model),
        3,
        1e-1,
        "toy",
        stopping=EarlyStopping(validate, "valid"),
        quiet=True,
    )
    torch.testing.assert_close(model.weight.detach(), snapshots[1])
    assert not torch.equal(snapshots[1], snapshots[2])


@pytest.mark.parametrize("every, expected", [(2, [2, 4, 5]), (1, [1, 2, 3, 4, 5])])
def test_validation_runs_every_n_epochs_and_after_the_last(every: int, expected: list[int]) -> None:
    validated: list[int] = []

    def validate(epoch: int) -> dict[str, float]:
        validated.append(epoch + 1)
        return {"valid": float(epoch)}

    model = _model()
    history = train_epochs(
        model,
        _batches,
        _loss(model),
        5,
        1e-2,
        "toy",
        stopping=EarlyStopping(validate, "valid", every=every),
        quiet=True,
    )
    assert validated == expected
    assert [r["epoch"] for r in history if "valid" in r] == expected


def test_make_step_moves_dense_weights_as_plain_adam_and_tables_as_lazy_adam() -> None:
    """The step's optimizers (fused Adam for dense parameters, LazyAdam for sparse tables)
    against the textbook ones, torch's per-tensor Adam and SparseAdam, on the same batches:
    a faster optimizer must not change what training computes."""

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = torch.nn.Embedding(30, 4, sparse=True)
            self.linear = torch.nn.Linear(4, 1)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.linear(self.table(ids)).squeeze(-1)

    torch.manual_seed(0)
    tested, reference = Model(), Model()
    reference.load_state_dict(tested.state_dict())
    initial = tested.linear.weight.detach().clone()
    step = make_step(tested, lambda batch: (tested(batch[0]) - batch[1]).square().mean(), 0.01)
    dense = [p for name, p in reference.named_parameters() if not name.startswith("table")]
    expected = [
        torch.optim.Adam(dense, lr=0.01, foreach=False, fused=False),
        torch.optim.SparseAdam([reference.table.weight], lr=0.01),
    ]
    generator = torch.Generator().manual_seed(1)
    for _ in range(20):
        batch = (
            torch.randint(0, 30, (16,), generator=generator),
            torch.randn(16, generator=generator),
        )
        step(batch)
        for optimizer in expected:
            optimizer.zero_grad()
        (reference(batch[0]) - batch[1]).square().mean().backward()
        for optimizer in expected:
            optimizer.step()
    for (name, got), want in zip(tested.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)
    assert not torch.equal(tested.linear.weight, initial)
