from __future__ import annotations

import pytest
import torch

from pipelines.training.lazy_adam import LazyAdam


def _tables(rows: int, dim: int, padding_idx: int | None) -> tuple[torch.nn.Embedding, ...]:
    torch.manual_seed(0)
    first = torch.nn.Embedding(rows, dim, padding_idx=padding_idx, sparse=True)
    second = torch.nn.Embedding(rows, dim, padding_idx=padding_idx, sparse=True)
    second.load_state_dict(first.state_dict())
    return first, second


@pytest.mark.parametrize("padding_idx", [None, 0])
def test_lazy_adam_moves_the_rows_sparse_adam_moves_by_the_same_amounts(
    padding_idx: int | None,
) -> None:
    """Batches that repeat rows, skip rows and hit the padding row: after every step the
    table must equal SparseAdam's, and rows no batch touched must not have moved."""
    reference, lazy = _tables(50, 8, padding_idx)
    initial = lazy.weight.detach().clone()
    expected = torch.optim.SparseAdam([reference.weight], lr=0.01, betas=(0.8, 0.99))
    tested = LazyAdam([lazy.weight], lr=0.01, betas=(0.8, 0.99))
    generator = torch.Generator().manual_seed(1)
    touched = torch.zeros(50, dtype=torch.bool)
    for _ in range(30):
        ids = torch.randint(0, 40, (16,), generator=generator)  # rows 40-49: never touched
        ids[:4] = ids[4]  # one row four times in the batch
        touched[ids] = True
        target = torch.randn(16, 8, generator=generator)
        for table, optimizer in ((reference, expected), (lazy, tested)):
            optimizer.zero_grad()
            (table(ids) - target).square().sum().backward()
            optimizer.step()
        torch.testing.assert_close(lazy.weight, reference.weight, rtol=1e-5, atol=1e-6)
    assert torch.equal(lazy.weight[~touched], initial[~touched])
    assert not torch.equal(lazy.weight[touched], initial[touched])
    assert tested.state[lazy.weight]["step"] == 30


def test_lazy_adam_skips_parameters_without_a_gradient_and_refuses_dense_ones() -> None:
    table = torch.nn.Embedding(5, 2, sparse=True)
    before = table.weight.detach().clone()
    optimizer = LazyAdam([table.weight])
    optimizer.step()  # no gradient yet: nothing moves, no state
    assert torch.equal(table.weight, before) and not optimizer.state
    dense = torch.nn.Parameter(torch.ones(3))
    dense.sum().backward()
    with pytest.raises(RuntimeError, match="sparse gradients"):
        LazyAdam([dense]).step()
    with pytest.raises(ValueError, match="lr > 0"):
        LazyAdam([dense], lr=0.0)
