from __future__ import annotations

import pytest
import torch

from core.errors import ConfigError
from pipelines.models.dlrm import DLRM
from pipelines.models.two_tower import ItemTower, QueryTower, TwoTower


def test_dlrm_shapes_and_dense_part_matches_full_model() -> None:
    torch.manual_seed(0)
    model = DLRM([10, 20, 30], n_dense=5, dim=8)
    sparse = torch.randint(0, 10, (7, 3))
    dense = torch.randn(7, 5)
    logits = model(sparse, dense)
    assert logits.shape == (7,)
    torch.testing.assert_close(model.dense_part(dense, model.embed(sparse)), logits)


def test_dlrm_rejects_widths_not_a_multiple_of_16_bytes() -> None:
    with pytest.raises(ConfigError, match="multiple of 16 bytes"):
        DLRM([10], n_dense=2, dim=6)


def _two_tower() -> TwoTower:
    torch.manual_seed(0)
    return TwoTower(QueryTower([5, 5], n_items=20), ItemTower([20], n_dense=2), temperature=0.1)


def test_towers_give_unit_vectors_and_history_padding_is_ignored() -> None:
    model = _two_tower()
    features = torch.tensor([[1, 2], [1, 2]])
    padded = model.query(features, torch.tensor([[0, 0, 3], [0, 0, 3]]))
    assert torch.allclose(padded.norm(dim=1), torch.ones(2))
    longer_padding = model.query(features[:1], torch.tensor([[0, 0, 0, 0, 3]]))
    torch.testing.assert_close(padded[:1], longer_padding)


def test_duplicate_positive_in_batch_is_not_a_negative() -> None:
    model = _two_tower()
    users = torch.tensor([[1, 1], [2, 2]])
    history = torch.zeros(2, 3, dtype=torch.long)
    items = torch.tensor([[4], [4]])
    dense = torch.zeros(2, 2)
    log_q = torch.zeros(2)
    loss = model.loss(users, history, items, dense, torch.tensor([4, 4]), log_q)
    assert loss.item() == pytest.approx(0.0, abs=1e-6)  # the only other candidate is masked


def test_log_q_correction_lowers_popular_items_less() -> None:
    model = _two_tower()
    args = (
        torch.tensor([[1, 1], [2, 2]]),
        torch.zeros(2, 3, dtype=torch.long),
        torch.tensor([[4], [5]]),
        torch.zeros(2, 2),
        torch.tensor([4, 5]),
    )
    uniform = model.loss(*args, torch.log(torch.tensor([0.5, 0.5])))
    skewed = model.loss(*args, torch.log(torch.tensor([0.99, 0.01])))
    assert not torch.isclose(uniform, skewed)


def test_catalog_loss_is_cross_entropy_over_the_items_not_excluded() -> None:
    model = _two_tower()
    users = torch.tensor([[1, 1], [2, 2]])
    history = torch.tensor([[0, 3], [0, 0]])
    catalog = torch.arange(6)[:, None]
    dense = torch.zeros(6, 2)
    targets = torch.tensor([2, 5])
    excluded = torch.zeros(2, 6, dtype=torch.bool)
    excluded[0, [1, 2, 4]] = True  # user 0's other positives (and its target, which is kept)
    loss = model.catalog_loss(users, history, targets, excluded, catalog, dense)
    logits = model.query(users, history) @ model.item(catalog, dense).T / model.temperature
    expected = torch.stack(
        [
            torch.nn.functional.cross_entropy(logits[0, [0, 2, 3, 5]], torch.tensor(1)),
            torch.nn.functional.cross_entropy(logits[1], torch.tensor(5)),
        ]
    ).mean()
    torch.testing.assert_close(loss, expected)
    assert excluded[0, 2]  # the caller's mask is not modified


def test_served_vectors_score_the_trained_logits_with_the_item_bias() -> None:
    """With an item bias, served query . served item = temperature x (cosine / T + bias):
    the order the softmax was trained on, and the bias moves the loss."""
    torch.manual_seed(0)
    model = TwoTower(
        QueryTower([5, 5], n_items=20), ItemTower([20], n_dense=2, bias=True), temperature=0.1
    )
    assert model.item.bias is not None
    with torch.no_grad():
        model.item.bias.weight.copy_(torch.randn(20, 1))
    features, history = torch.tensor([[1, 2], [3, 4]]), torch.tensor([[0, 5, 6], [7, 8, 9]])
    items = torch.tensor([[3], [7], [11]])
    dense = torch.randn(3, 2)
    users = model.query(features, history)
    logits = users @ model.item(items, dense).T / 0.1 + model.item.bias.weight[items[:, 0], 0]
    served = model.served_query()(features, history) @ model.served_items(items, dense).T
    torch.testing.assert_close(served, 0.1 * logits)
    assert model.served_query()(features, history).shape == (2, 65)

    targets, excluded = torch.tensor([0, 2]), torch.zeros(2, 3, dtype=torch.bool)
    before = model.catalog_loss(features, history, targets, excluded, items, dense)
    with torch.no_grad():
        model.item.bias.weight[items[:, 0]] += torch.tensor([[5.0], [0.0], [5.0]])
    assert model.catalog_loss(features, history, targets, excluded, items, dense) < before


def test_without_a_bias_the_served_vectors_are_the_towers() -> None:
    model = _two_tower()
    features, history = torch.tensor([[1, 2]]), torch.tensor([[0, 5, 6]])
    items, dense = torch.tensor([[3], [7]]), torch.randn(2, 2)
    torch.testing.assert_close(
        model.served_query()(features, history), model.query(features, history)
    )
    torch.testing.assert_close(model.served_items(items, dense), model.item(items, dense))


def test_linear_skip_adds_a_linear_path_beside_the_mlp() -> None:
    torch.manual_seed(0)
    item = ItemTower([20], n_dense=2, hidden=8, out_dim=4, skip=True)
    assert item.skip is not None
    features, dense = torch.tensor([[3], [7]]), torch.randn(2, 2)
    for parameter in item.mlp.parameters():  # without the MLP, the tower is the linear path
        torch.nn.init.zeros_(parameter)
    inputs = torch.cat([item.features[0](features[:, 0]), item.dense(dense)], dim=1)
    expected = torch.nn.functional.normalize(inputs @ item.skip.weight.T, dim=-1)
    torch.testing.assert_close(item(features, dense), expected)
    assert ItemTower([20], n_dense=2).skip is None
    assert QueryTower([5], n_items=20, skip=True).skip is not None
