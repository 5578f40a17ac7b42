"""Distinct values of a large column, so that an op's per-value work is done once per value.

Offline, a column of millions of rows holds few distinct values (a user's zip code repeated
on each of their interactions, an item's genres on each of its). Ops whose output depends
only on the value (categorify, multi-hot) encode the distinct values and gather the result
by each row's code: one hash pass over the rows instead of a string conversion and a string
sort or search per row. Small batches (online requests) are encoded directly.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

MIN_ROWS = 4096  # below this, encoding every row directly costs less than hashing them


def distinct(values: np.ndarray, exact_text: bool = True) -> tuple[np.ndarray, np.ndarray] | None:
    """``(uniques, codes)`` with ``values[i]`` equal to ``uniques[codes[i]]``, or None where
    this would not pay (a small batch) or could merge values an op tells apart.

    With ``exact_text``, the caller keys values by their text (``str``), so two values may
    share a code only if their texts are equal: true of integers, booleans and strings, not
    of floats (``0.0 == -0.0``) nor of mixed objects (``1 == 1.0 == True``), which are
    left to the caller. Missing values (None, NaN) keep their own kinds: one unique each for
    every distinct text among them. ``uniques`` may repeat a text; it is never empty when
    ``values`` is not.
    """
    values = np.asarray(values)
    if values.ndim != 1 or len(values) < MIN_ROWS:
        return None
    kind = values.dtype.kind
    if kind not in "biuUSOf" or (exact_text and kind == "f"):
        return None
    codes, found = pd.factorize(values, use_na_sentinel=True)
    uniques = np.asarray(found, dtype=object if kind == "O" else found.dtype)
    if exact_text and kind == "O" and not all(type(value) is str for value in uniques.tolist()):
        return None
    codes = np.asarray(codes, dtype=np.int64)
    missing = codes < 0
    if missing.any():
        _, first, which = np.unique(
            values[missing].astype(str), return_index=True, return_inverse=True
        )
        codes[missing] = len(uniques) + which.reshape(-1)
        uniques = np.concatenate([uniques.astype(object), values[missing][first].astype(object)])
    return uniques, codes
