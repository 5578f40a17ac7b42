from __future__ import annotations

import pytest
import torch

from pipelines.threads import all_cores, available_cores, torch_threads


def test_torch_threads_are_set_inside_the_block_and_restored_after_it_even_on_error() -> None:
    before = torch.get_num_threads()
    with torch_threads(before + 1):
        assert torch.get_num_threads() == before + 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), torch_threads(before + 2):
        raise RuntimeError("inside")
    assert torch.get_num_threads() == before
    with all_cores():
        assert torch.get_num_threads() == available_cores() >= 1
    assert torch.get_num_threads() == before
