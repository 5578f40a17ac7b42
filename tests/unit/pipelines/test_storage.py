"""Feature columns in parquet: written flat, read whole or their first rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipelines.storage import flatten, read_columns, write_parquet


def test_the_first_rows_are_read_a_row_group_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "rows.parquet"
    columns = {
        "dense": np.arange(400_000, dtype=np.float32).reshape(-1, 2),
        "label": np.ones(200_000),
    }
    write_parquet(path, flatten(columns, ("dense", "label")), row_group_size=50_000)
    whole = read_columns(path, ["dense_1", "label"])
    assert len(whole["label"]) == 200_000
    for rows in (1, 65_536, 70_001, 200_000, 10**9):
        first = read_columns(path, ["dense_1", "label"], max_rows=rows)
        kept = min(rows, 200_000)
        np.testing.assert_array_equal(first["dense_1"], whole["dense_1"][:kept])
        assert first["label"].dtype == whole["label"].dtype and len(first["label"]) == kept
