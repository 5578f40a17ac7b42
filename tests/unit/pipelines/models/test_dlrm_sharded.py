"""BagDLRM (DLRM's tables in one EmbeddingBagCollection) in one process, unsharded."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchrec")

from pipelines.models.dlrm import DLRM
from pipelines.models.dlrm_sharded import BagDLRM, to_bag_state, to_dlrm_state

CARDINALITIES = [30, 200, 5]


def test_same_weights_same_logits_and_state_round_trip() -> None:
    torch.manual_seed(0)
    plain = DLRM(CARDINALITIES, 4, dim=8)
    bag = BagDLRM.from_dlrm(plain)
    sparse = torch.stack([torch.randint(0, n, (9,)) for n in CARDINALITIES], dim=1)
    dense = torch.randn(9, 4)
    with torch.no_grad():
        assert torch.equal(bag(sparse, dense), plain(sparse, dense))
    back = to_dlrm_state(bag.state_dict(), len(CARDINALITIES))
    assert set(back) == set(plain.state_dict())
    for key, value in plain.state_dict().items():
        assert torch.equal(back[key], value), key
    assert set(to_bag_state(plain.state_dict(), len(CARDINALITIES))) == set(bag.state_dict())


def test_on_meta_only_the_shapes_are_taken() -> None:
    plain = DLRM(CARDINALITIES, 4, dim=8)
    bag = BagDLRM.from_dlrm(plain, device=torch.device("meta"))
    weights = [p for name, p in bag.named_parameters() if name.startswith("ebc.")]
    assert [tuple(w.shape) for w in weights] == [(n, 8) for n in CARDINALITIES]
    assert all(w.is_meta for w in weights)
