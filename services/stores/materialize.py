"""``cascade materialize``: load a release's online tables into the online store."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pandas as pd

from core.errors import ArtifactError
from core.export.verify import verify_model_directory, verify_version
from services.embedding_cache.backing import RedisRows
from services.inference.embeddings import read_table_spec
from services.stores.base import OnlineStore, UserRecord

BATCH = 2_000
NOTHING_WRITTEN = "nothing was written; re-copy the version from the export store or re-export it"


def user_records(release_dir: Path) -> list[UserRecord]:
    """Users (attributes as text), their recent positives and seen items, from a release."""
    online = release_dir / "online"
    for name in ("users.parquet", "histories.parquet"):
        if not (online / name).is_file():
            raise ArtifactError(
                f"{online / name} is missing: re-export with `cascade train export`"
            )
    users = pd.read_parquet(online / "users.parquet")
    histories = pd.read_parquet(online / "histories.parquet").set_index("user_id")
    empty = np.zeros(0, np.int64)
    records = []
    names = [c for c in users.columns if c != "user_id"]  # the schema's user features
    for row in users.itertuples(index=False):
        user_id = int(row.user_id)  # type: ignore[arg-type]
        attributes = {name: str(getattr(row, name)) for name in names}
        if user_id in histories.index:
            history = histories.loc[user_id]
            recent = np.asarray(history["recent"], np.int64)
            seen = np.asarray(history["seen"], np.int64)
        else:
            recent, seen = empty, empty
        records.append(UserRecord(user_id, attributes, recent, seen))
    return records


def materialize_embeddings(rows: RedisRows, model_repository: Path, version: int) -> int:
    """Write every row of every DLRM table of ``version`` to Redis (binary, pipelined,
    under the version's own keys); return the rows written. The ranker's files are checked
    against the manifest first: a corrupted table raises ``ArtifactError``, writing nothing."""
    verify_model_directory(model_repository / "ranker" / str(version), NOTHING_WRITTEN)
    directory = model_repository / "ranker" / str(version) / "embeddings"
    spec = read_table_spec(directory)
    written = sum(
        rows.write_table(version, column, np.load(directory / f"{column}.npy", mmap_mode="r"))
        for column in spec.columns
    )
    rows.mark_complete(version, spec.rows, spec.dim)
    return written


async def materialize(store: OnlineStore, release_dir: Path) -> int:
    """Write every user of the release into ``store``, then its completeness marker (so a
    store that lost its data, or was half written, is told apart); return how many.

    The whole version (release and model files) is checked against its manifest first, so a
    corrupted file stops ``cascade materialize`` before it writes users or embedding rows.
    """
    version = int(release_dir.name)
    await asyncio.to_thread(verify_version, release_dir.parents[1], version, None, NOTHING_WRITTEN)
    records = user_records(release_dir)
    for start in range(0, len(records), BATCH):
        await store.write_users(records[start : start + BATCH])
    await store.mark_loaded(int(release_dir.name), len(records))
    return len(records)
