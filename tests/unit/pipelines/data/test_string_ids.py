"""String ids row by row: the fingerprints' two paths agree, ids follow first-seen order with
repeats, rejected strings keep their code, and strings whose first 64 bits clash still get
their own ids."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipelines.data import string_ids
from pipelines.data.string_ids import StringIds, fingerprints


def reference(batches: list[list[str]]) -> list[list[int]]:
    """Ids in first-seen order, by a plain dict."""
    known: dict[str, int] = {}
    return [[known.setdefault(w, len(known) + 1) for w in batch] for batch in batches]


def test_fixed_and_variable_width_strings_hash_alike() -> None:
    words = ["u0001234", "SKU-000123", "a", "", "ü用户", "x" * 40, "y" * 16, "z" * 17]
    mixed = fingerprints(pa.array(words))  # varying widths
    for i, word in enumerate(words):
        alone = fingerprints(pa.array([word, word]))  # one width
        assert (alone[0] == mixed[0][i]).all() and (alone[1] == mixed[1][i]).all()
    sliced = fingerprints(pa.array(["pad", *words]).slice(1))
    large = fingerprints(pa.array(words, pa.large_string()))
    for other in (sliced, large):
        assert (other[0] == mixed[0]).all() and (other[1] == mixed[1]).all()
    assert len(set(mixed[0].tolist())) == len(words)  # distinct strings, distinct hashes


def test_rows_with_repeats_follow_first_seen_order_across_batches() -> None:
    many = [f"k{i % 700}" for i in range(5000)]
    batches = [["b", "a", "b", "c", "a"], ["c", "d", "a", "d"], many]
    table = StringIds()
    got = [table.ids(pa.array(batch)).tolist() for batch in batches]
    assert got == reference(batches)
    assert table.words() == ["b", "a", "c", "d", *[f"k{i}" for i in range(700)]]
    assert table.count == 704


def test_rejected_strings_get_id_zero_and_their_code_every_time() -> None:
    def check(words: pa.Array) -> np.ndarray:
        return np.array([2 if w == "" else 0 for w in words.to_pylist()], np.uint8)

    table = StringIds()
    ids, codes = table.lookup(pa.array(["a", "", "b"]), check)
    assert ids.tolist() == [1, 0, 2] and codes.tolist() == [0, 2, 0]
    ids, codes = table.lookup(pa.array(["", "b", "c"]), check)
    assert ids.tolist() == [0, 2, 3] and codes.tolist() == [2, 0, 0]
    ids, codes = table.lookup(pa.array(["c", "a"]), check)
    assert ids.tolist() == [3, 1] and codes is None
    assert table.words() == ["a", "b", "c"]


def test_strings_sharing_the_first_64_bits_get_their_own_ids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = string_ids.fingerprints

    def weak(words: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        h1, h2 = real(words)
        return h1 & np.uint64(3), h2  # at most four distinct first halves: many clashes

    monkeypatch.setattr(string_ids, "fingerprints", weak)
    table = StringIds()
    batches = [[f"w{i % 37}" for i in range(200)], [f"w{i % 53}" for i in range(300)]]
    seen: dict[str, int] = {}
    for batch in batches:
        ids = table.ids(pa.array(batch)).tolist()
        for word, id_ in zip(batch, ids, strict=True):
            assert seen.setdefault(word, id_) == id_  # one string, one id, every time
    assert sorted(seen.values()) == list(range(1, 54))  # distinct strings, distinct ids 1..N
    words = table.words()
    assert all(words[id_ - 1] == word for word, id_ in seen.items())

    def no_w5(words: pa.Array) -> np.ndarray:
        return np.array([w == "w5" for w in words.to_pylist()], np.uint8)

    other = StringIds()
    ids, codes = other.lookup(pa.array([f"w{i}" for i in range(12)] * 2), no_w5)
    assert ids[5] == ids[17] == 0 and codes is not None and codes[[5, 17]].tolist() == [1, 1]
    assert len(set(ids.tolist()) - {0}) == 11
