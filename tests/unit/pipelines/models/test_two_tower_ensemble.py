"""An ensemble of two-towers is served as one: the concatenated vectors score the summed logits."""

from __future__ import annotations

import pytest
import torch

from pipelines.models.two_tower import ItemTower, QueryTower, TwoTower
from pipelines.models.two_tower_ensemble import TwoTowerEnsemble


def _member(temperature: float = 0.1, bias: bool = True) -> TwoTower:
    model = TwoTower(
        QueryTower([5, 5], n_items=20), ItemTower([20], n_dense=2, bias=bias), temperature
    )
    if model.item.bias is not None:
        with torch.no_grad():
            model.item.bias.weight.copy_(torch.randn(20, 1))
    return model


@pytest.mark.parametrize("bias", [True, False])
def test_served_vectors_score_the_sum_of_the_members_logits(bias: bool) -> None:
    torch.manual_seed(0)
    members = [_member(bias=bias) for _ in range(3)]
    ensemble = TwoTowerEnsemble(members)
    features, history = torch.tensor([[1, 2], [3, 4]]), torch.tensor([[0, 5, 6], [7, 8, 9]])
    items, dense = torch.tensor([[3], [7], [11], [19]]), torch.randn(4, 2)
    with torch.no_grad():
        summed = sum(m.logits(m.query(features, history), items, dense) for m in members)
        served = ensemble.served_query()(features, history) @ ensemble.served_items(items, dense).T
        single = members[0].served_query()(features, history)
    torch.testing.assert_close(served, 0.1 * summed)
    assert ensemble.served_query()(features, history).shape == (2, 3 * single.shape[1])
    # the members differ, so the sum is not one member's scores scaled
    first = members[0].served_query()(features, history) @ members[0].served_items(items, dense).T
    assert not torch.allclose(served, 3 * first.detach(), atol=1e-3)


def test_an_ensemble_needs_two_members_of_one_temperature() -> None:
    with pytest.raises(ValueError, match="at least 2 members"):
        TwoTowerEnsemble([_member()])
    with pytest.raises(ValueError, match="temperatures differ"):
        TwoTowerEnsemble([_member(0.1), _member(0.2)])


def test_the_ensemble_state_dict_round_trips_every_member() -> None:
    torch.manual_seed(0)
    saved = TwoTowerEnsemble([_member(), _member()])
    loaded = TwoTowerEnsemble([_member(), _member()])
    loaded.load_state_dict(saved.state_dict())
    for a, b in zip(saved.state_dict().values(), loaded.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b)
    assert any(key.startswith("members.1.") for key in saved.state_dict())
