"""Benchmark: ingesting a team's own event logs (``--data dataset.yaml``) against pyarrow
reading the same files and columns.

For each size it generates (once, kept under ``--workdir``) parquet event logs like a shop's:
string user ids ("u0001234"), SKU item ids ("SKU-000123"), millisecond timestamps and an
``action`` column, with a dataset file over them. Then, each in a child process whose peak RSS
is measured: pyarrow scanning the files (the engine-only read), and ``ingest`` of the same
files, and the prepare step on what ingest wrote (streaming: a partition at a
time). Each child also reports its CPU seconds (all threads): on a shared machine the CPU
ratio swings less than the wall-clock one. After the prepare, the floor of any prepare that
writes the same output: pyarrow writing the prepare's files from memory (parquet with each
file's own compression and row groups, other files as their bytes), added to the engine read
of the input. Prints a line per step and, as the last line, one
JSON object (also written to ``bench/results/ingest.json``).

    python bench/ingest.py [--sizes 10000000,50000000,200000000] [--workdir /tmp/cascade-ingest]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from publish import publish

ROWS_PER_FILE = 10_000_000
ACTIONS = ["view", "click", "add_to_cart", "purchase"]
ACTION_SHARES = [0.70, 0.20, 0.07, 0.03]
BYTES_PER_ROW = 200  # input, ingest output, the prepare's output and its floor copy, and spare
DATASET = """\
name: shop-{rows}
interactions:
  path: events/
  user: customer_id
  item: sku
  timestamp: ts
  event: {{column: action, positive: [purchase, add_to_cart, click], weight: {{purchase: 3.0}}}}
"""
COLUMNS = ["customer_id", "sku", "ts", "action"]


def _ids(prefix: str, numbers: np.ndarray, width: int) -> pa.Array:
    text = pc.utf8_lpad(pa.array(numbers).cast(pa.string()), width, "0")
    return pc.binary_join_element_wise(prefix, text, "")


def generate(directory: Path, rows: int, seed: int = 0) -> Path:
    """Event logs of ``rows`` rows and their dataset file under ``directory`` (kept: a
    second run reuses them)."""
    dataset = directory / "dataset.yaml"
    if dataset.exists():
        return dataset
    events = directory / "events"
    shutil.rmtree(events, ignore_errors=True)
    events.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    users, items = max(rows // 100, 1000), max(rows // 400, 1000)
    start = 1_700_000_000_000
    for part, first in enumerate(range(0, rows, ROWS_PER_FILE)):
        n = min(ROWS_PER_FILE, rows - first)
        popular = np.minimum(rng.zipf(1.3, n), items) - 1  # a long tail of items
        item = (popular * 7919) % items + 1
        stamps = start + np.sort(rng.integers(0, 30 * 86_400_000, n)) + part * 30 * 86_400_000
        table = pa.table(
            {
                "customer_id": _ids("u", rng.integers(1, users + 1, n), 7),
                "sku": _ids("SKU-", item, 6),
                "ts": pa.array(stamps, pa.int64()),
                "action": pa.array(
                    rng.choice(len(ACTIONS), n, p=ACTION_SHARES)
                ).dictionary_encode(),
            }
        )
        table = table.set_column(
            3, "action", pc.take(pa.array(ACTIONS), table["action"].combine_chunks().indices)
        )
        pq.write_table(table, events / f"part-{part:04d}.parquet", row_group_size=1 << 20)
        print(f"  generated {first + n:,} / {rows:,} rows", flush=True)
    dataset.write_text(DATASET.format(rows=rows))
    return dataset


def engine_read(dataset: Path) -> dict[str, Any]:
    """pyarrow scanning the event files, the columns ingest reads (the child's work)."""
    started, cpu = time.perf_counter(), cpu_seconds()
    files = sorted(str(p) for p in (dataset.parent / "events").glob("*.parquet"))
    rows = 0
    for batch in ds.dataset(files, format="parquet").to_batches(columns=COLUMNS):
        rows += batch.num_rows
    return {"rows": rows, "seconds": time.perf_counter() - started, "cpu_s": cpu_seconds() - cpu}


def cpu_seconds() -> float:
    """CPU seconds of this process so far, every thread (imports excluded by the callers,
    which take the difference around the work alone, as for the wall clock)."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def run_ingest(dataset: Path) -> dict[str, Any]:
    """``ingest`` of the data set into a sibling ``out`` directory (the child's work)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from pipelines.data.dataset_file import load_dataset_file
    from pipelines.data.ingest import ingest

    started, cpu = time.perf_counter(), cpu_seconds()
    out, log = dataset.parent / "out", lambda line: print(line, flush=True)
    summary = ingest(load_dataset_file(dataset), out, log)
    seconds = time.perf_counter() - started
    return {
        "rows": summary["rows"],
        "seconds": seconds,
        "cpu_s": cpu_seconds() - cpu,
        "summary": summary,
    }


def run_prepare(dataset: Path, mode: str) -> dict[str, Any]:
    """The prepare step (``mode``: ``streaming``, a partition at a time; ``memory``, the
    interactions loaded whole) on what ingest wrote into ``out`` (the child's work)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from pipelines.data.ingest import load_ingested
    from pipelines.prepare import prepare
    from pipelines.prepare_streaming import ingested_rows, prepare_ingested

    ingested, workdir = dataset.parent / "out", dataset.parent / f"prepared-{mode}"
    shutil.rmtree(workdir, ignore_errors=True)
    started, cpu = time.perf_counter(), cpu_seconds()
    if mode == "streaming":
        prepare_ingested(ingested, workdir, log=lambda line: print(line, flush=True))
    else:
        prepare(load_ingested(ingested), workdir)
    seconds = time.perf_counter() - started
    return {"rows": ingested_rows(ingested), "seconds": seconds, "cpu_s": cpu_seconds() - cpu}


def write_floor(prepared: Path) -> dict[str, Any]:
    """pyarrow writing every file of ``prepared`` again from memory (the child's work): the
    least any prepare that writes this output spends on writing it. Parquet files go a row
    group at a time (with each file's codec, row groups and dictionary use), so memory stays
    bounded; only the writes are timed, not the reads that load them."""
    target = prepared.with_name(prepared.name + "-floor")
    shutil.rmtree(target, ignore_errors=True)
    spent = {"seconds": 0.0, "cpu_s": 0.0}

    @contextmanager
    def timed() -> Iterator[None]:
        started, used = time.perf_counter(), cpu_seconds()
        yield
        spent["seconds"] += time.perf_counter() - started
        spent["cpu_s"] += cpu_seconds() - used

    written = files = 0
    for path in sorted(p for p in prepared.rglob("*") if p.is_file()):
        copy = target / path.relative_to(prepared)
        copy.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix != ".parquet":
            content = path.read_bytes()
            with timed():
                copy.write_bytes(content)
        else:
            piece = pq.ParquetFile(path)
            first = piece.metadata.row_group(0) if piece.metadata.num_row_groups else None
            codec = first.column(0).compression.lower() if first and first.num_columns else "none"
            options = {
                "compression": "none" if codec == "uncompressed" else codec,
                "use_dictionary": bool(first)
                and any(first.column(i).has_dictionary_page for i in range(first.num_columns)),
            }
            with timed():
                writer = pq.ParquetWriter(copy, piece.schema_arrow, **options)
            for group in range(piece.num_row_groups):
                table = piece.read_row_group(group)  # loading is not timed
                with timed():
                    writer.write_table(table, row_group_size=max(table.num_rows, 1))
            with timed():
                writer.close()
        written, files = written + copy.stat().st_size, files + 1
    shutil.rmtree(target)
    return {**spent, "bytes": written, "files": files}


def in_child(step: str, dataset: Path) -> dict[str, Any]:
    """Run ``step`` in a child process; its result, with the child's peak RSS in GB."""
    child = subprocess.Popen(
        [sys.executable, __file__, "--child", step, str(dataset)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    output = ""
    for line in child.stdout:  # progress lines pass through, the last one is the result
        output += line
        if not line.startswith("{"):
            print(line, end="", flush=True)
    status = child.wait()
    if status != 0:
        raise SystemExit(f"{step} failed (status {status}) on {dataset}")
    return json.loads(output.strip().splitlines()[-1])


def peak_rss_gb() -> float:
    """This process's peak resident memory (VmHWM: since its exec, unlike ru_maxrss, which a
    child inherits from the parent it was forked from)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024**2, 2)
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--sizes", default="10000000,50000000,200000000", help="rows per size")
    parser.add_argument(
        "--workdir", type=Path, default=Path("/tmp/cascade-ingest"), help="data kept, reused"
    )
    parser.add_argument("--keep-output", action="store_true", help="keep what ingest wrote")
    parser.add_argument(
        "--parity-seeds",
        default="0",
        help="seeds of the MovieLens parity check (bench/ingest_parity.py; empty: skip it)",
    )
    parser.add_argument(
        "--prepare",
        default="streaming",
        help="prepare steps to run after ingest, comma-separated: streaming (a partition at "
        "a time), memory (whole; needs about 40x the rows in bytes), or empty for none",
    )
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        step, path = args.child[0], Path(args.child[1])
        if step == "generate":  # here, so that the parent stays small
            generate(path.parent, int(path.parent.name.removeprefix("rows-")))
            result: dict[str, Any] = {}
        elif step.startswith("prepare-"):
            result = run_prepare(path, step.removeprefix("prepare-"))
        elif step.startswith("floor-"):
            result = write_floor(path.parent / f"prepared-{step.removeprefix('floor-')}")
        else:
            result = engine_read(path) if step == "read" else run_ingest(path)
        result["peak_rss_gb"] = peak_rss_gb()
        print(json.dumps(result), flush=True)
        return

    sizes = [int(s) for s in args.sizes.split(",")]
    args.workdir.mkdir(parents=True, exist_ok=True)
    need = sum(sizes) * BYTES_PER_ROW
    free = shutil.disk_usage(args.workdir).free
    print(f"workdir {args.workdir}: {free / 1e9:.1f} GB free, about {need / 1e9:.1f} GB needed")
    if free < need:
        raise SystemExit(f"not enough free disk under {args.workdir}: pass smaller --sizes")
    results = []
    for rows in sizes:
        dataset = args.workdir / f"rows-{rows}" / "dataset.yaml"
        if not dataset.exists():
            in_child("generate", dataset)
        read = in_child("read", dataset)
        print(
            f"{rows:>12,} rows  engine read  {read['rows'] / read['seconds']:>12,.0f} rows/s"
            f"  {read['seconds']:7.1f} s  {read['cpu_s']:7.1f} CPU-s"
            f"  peak RSS {read['peak_rss_gb']:.2f} GB",
            flush=True,
        )
        done = in_child("ingest", dataset)
        rate, engine = done["rows"] / done["seconds"], read["rows"] / read["seconds"]
        print(
            f"{rows:>12,} rows  ingest       {rate:>12,.0f} rows/s  {done['seconds']:7.1f} s"
            f"  {done['cpu_s']:7.1f} CPU-s  peak RSS {done['peak_rss_gb']:.2f} GB"
            f"  engine/ingest {engine / rate:.2f}x (CPU {done['cpu_s'] / read['cpu_s']:.2f}x)",
            flush=True,
        )
        prepared = {}
        for mode in [m for m in args.prepare.split(",") if m.strip()]:
            step = in_child(f"prepare-{mode}", dataset)
            prepared[mode] = {
                "rows_per_s": round(step["rows"] / step["seconds"]),
                "seconds": round(step["seconds"], 1),
                "cpu_s": round(step["cpu_s"], 1),
                "peak_rss_gb": step["peak_rss_gb"],
            }
            print(
                f"{rows:>12,} rows  prepare ({mode}) {prepared[mode]['rows_per_s']:>12,} rows/s"
                f"  {step['seconds']:7.1f} s  {step['cpu_s']:7.1f} CPU-s"
                f"  peak RSS {step['peak_rss_gb']:.2f} GB",
                flush=True,
            )
            floor = in_child(f"floor-{mode}", dataset)
            shutil.rmtree(dataset.parent / f"prepared-{mode}")
            least = read["seconds"] + floor["seconds"]  # read the input, write the output
            prepared[mode].update(
                {
                    "output_gb": round(floor["bytes"] / 1e9, 2),
                    "write_floor_s": round(floor["seconds"], 2),
                    "floor_over_engine": round(least / read["seconds"], 2),
                    "prepare_over_engine": round(step["seconds"] / read["seconds"], 1),
                    "prepare_over_floor": round(step["seconds"] / least, 1),
                }
            )
            print(
                f"{rows:>12,} rows  floor: pyarrow writes the prepare's {floor['files']} files"
                f" ({floor['bytes'] / 1e9:.2f} GB) in {floor['seconds']:.2f} s"
                f" ({floor['cpu_s']:.2f} CPU-s); engine read + that write ="
                f" {least / read['seconds']:.2f}x the engine read; the prepare"
                f" {step['seconds'] / read['seconds']:.1f}x the engine read,"
                f" {step['seconds'] / least:.1f}x the floor",
                flush=True,
            )
        if not args.keep_output:
            shutil.rmtree(dataset.parent / "out", ignore_errors=True)
        results.append(
            {
                "prepare": prepared,
                "rows": done["rows"],
                "rows_per_s": round(rate),
                "engine_rows_per_s": round(engine),
                "engine_over_ingest": round(engine / rate, 2),
                "cpu_s": round(done["cpu_s"], 1),
                "engine_cpu_s": round(read["cpu_s"], 1),
                "cpu_over_engine": round(done["cpu_s"] / read["cpu_s"], 2),
                "seconds": round(done["seconds"], 1),
                "peak_rss_gb": done["peak_rss_gb"],
                "engine_peak_rss_gb": read["peak_rss_gb"],
            }
        )
    record = {"sizes": results, "parity": parity(args.workdir / "parity", args.parity_seeds)}
    publish("ingest", record)


def parity(workdir: Path, seeds: str) -> list[dict[str, Any]] | None:
    """MovieLens natively and written as foreign-format CSV with string ids through
    ``--data``, same seeds: both paths' test NDCG@10 and AUC (bench/ingest_parity.py)."""
    from ingest_parity import parity as train_both

    chosen = [int(s) for s in seeds.split(",") if s.strip()]
    results = [train_both(workdir / f"seed-{seed}", seed=seed) for seed in chosen]
    for result in results:
        print(f"parity: {json.dumps(result, sort_keys=True)}", flush=True)
    return results or None


if __name__ == "__main__":
    main()
