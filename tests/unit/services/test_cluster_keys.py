"""The embedding rows' key layout on a Redis Cluster: slots as Redis computes them, rows of one
bucket in one slot, a table over many slots."""

from __future__ import annotations

import numpy as np
import pytest

from services.embedding_cache.cluster import BUCKETS, SLOTS, key_slot, row_names, table_slots


def test_key_slot_is_redis_crc16_and_honours_hash_tags() -> None:
    assert key_slot(b"123456789") == 0x31C3  # the Redis Cluster spec's CRC16 test vector
    assert key_slot(b"{123456789}:row:7") == key_slot(b"123456789")
    assert key_slot(b"{a}{b}") == key_slot(b"a")  # the first tag only
    assert 0 <= key_slot(b"x" * 1000) < SLOTS


def test_rows_of_one_bucket_share_a_slot_and_a_table_spreads() -> None:
    rows = np.arange(10 * BUCKETS)
    names = row_names(b"cascade:emb:v3:user:", 3, "user", rows)
    assert names[17] == b"cascade:emb:v3:user:{v3:user:17}:17"
    slots = np.array([key_slot(n) for n in names])
    np.testing.assert_array_equal(slots, table_slots(3, "user")[rows % BUCKETS])
    for bucket in range(BUCKETS):
        assert len(set(slots[rows % BUCKETS == bucket])) == 1
    assert len(set(slots)) > BUCKETS * 0.9  # distinct slots (a few may collide)
    assert set(table_slots(4, "user")) != set(table_slots(3, "user"))  # versions apart


def test_table_slots_are_read_only() -> None:
    with pytest.raises(ValueError):
        table_slots(3, "user")[0] = 1
