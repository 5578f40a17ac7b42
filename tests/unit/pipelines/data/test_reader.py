"""The reader: parquet text columns come as dictionaries unless asked for plain."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.data.reader import read_batches


def test_parquet_text_columns_as_dictionaries_except_the_plain_ones(tmp_path: Path) -> None:
    rows = {"user": ["u1", "u2", "u1"], "action": ["view", "buy", "view"], "ts": [1, 2, 3]}
    for part in range(2):
        pq.write_table(pa.table(rows), tmp_path / f"e{part}.parquet", row_group_size=2)
    files = sorted(tmp_path.glob("*.parquet"))
    batches = list(read_batches(files, ["user", "action", "ts"], plain=["user"]))
    assert [(b.file.name, b.offset, b.data.num_rows) for b in batches] == [
        ("e0.parquet", 0, 2),
        ("e0.parquet", 2, 1),
        ("e1.parquet", 0, 2),
        ("e1.parquet", 2, 1),
    ]
    assert all(b.data.schema.field("user").type == pa.string() for b in batches)
    assert all(pa.types.is_dictionary(b.data.schema.field("action").type) for b in batches)
    users = [u for b in batches for u in b.data.column("user").to_pylist()]
    assert users == rows["user"] * 2
