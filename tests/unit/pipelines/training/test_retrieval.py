"""The two-tower's batches: the target hidden from the history, the users' positives masked
out of the full softmax's negatives."""

from __future__ import annotations

import numpy as np
import torch

from core.features.ops.categorify import OOV_ID
from pipelines.prepare import RetrievalData
from pipelines.training.retrieval import TwoTowerBatches


def _data() -> RetrievalData:
    rng = np.random.default_rng(0)
    n_users, n_items = 30, 25
    pairs = np.unique(
        np.stack([rng.integers(0, n_users, 300), rng.integers(0, n_items, 300)], axis=1), axis=0
    )
    item_idx = np.arange(n_items) + 1  # item_id_idx: 0 is the padding id
    history = np.zeros((n_users, 4), np.int64)
    for user in range(n_users):
        liked = item_idx[pairs[pairs[:, 0] == user, 1]][-4:]
        history[user, 4 - len(liked) :] = liked
    return RetrievalData(
        user_ids=np.arange(n_users) + 100,
        item_ids=np.arange(n_items) + 500,
        user_features=np.stack([np.arange(n_users) + 1, np.ones(n_users, np.int64)], axis=1),
        history=history,
        item_features=item_idx[:, None],
        item_dense=np.zeros((n_items, 2), np.float32),
        item_log_q=np.full(n_items, -np.log(n_items), np.float32),
        positives={"train": pairs, "valid": pairs[:0], "test": pairs[:0]},
    )


def test_full_softmax_batches_mask_exactly_the_users_training_positives() -> None:
    data = _data()
    batches = TwoTowerBatches(data, batch=64, seed=0, full_softmax=True)
    liked = np.zeros((len(data.user_ids), len(data.item_ids)), bool)
    liked[data.positives["train"][:, 0], data.positives["train"][:, 1]] = True
    seen = 0
    for features, history, targets, excluded in batches.epoch(0):
        users = features[:, 0].numpy() - 1
        np.testing.assert_array_equal(excluded.numpy(), liked[users])
        assert excluded[torch.arange(len(targets)), targets].all()  # targets are positives
        target_ids = data.item_features[targets.numpy(), 0]
        assert not (history.numpy() == target_ids[:, None]).any()  # the target is hidden
        seen += len(targets)
    assert seen == len(data.positives["train"])
    assert len(batches) == -(-seen // 64)


def test_sampled_softmax_batches_carry_the_positives_inputs_and_log_q() -> None:
    data = _data()
    batches = TwoTowerBatches(data, batch=64, seed=0)
    _, history, item_features, item_dense, items, log_q = next(iter(batches.epoch(0)))
    np.testing.assert_array_equal(item_features.numpy(), data.item_features[items.numpy()])
    np.testing.assert_array_equal(log_q.numpy(), data.item_log_q[items.numpy()])
    assert item_dense.shape == (len(items), 2)
    assert not (history == item_features[:, :1]).any()


def test_dropout_hides_history_entries_and_user_ids_at_the_asked_rates() -> None:
    data = _data()
    plain = TwoTowerBatches(data, batch=4096, seed=0, full_softmax=True)
    noisy = TwoTowerBatches(
        data, batch=4096, seed=0, full_softmax=True, history_dropout=0.5, user_id_dropout=0.3
    )
    features, history, _, _ = next(iter(plain.epoch(0)))
    dropped_features, dropped_history, _, _ = next(iter(noisy.epoch(0)))
    assert (dropped_features[:, 1:] == features[:, 1:]).all()
    replaced = dropped_features[:, 0] != features[:, 0]
    assert (dropped_features[replaced, 0] == OOV_ID).all()
    assert 0.2 < float(replaced.float().mean()) < 0.4
    kept = history > 0
    assert (dropped_history[~kept] == 0).all()
    assert 0.4 < float((dropped_history[kept] == 0).float().mean()) < 0.6
