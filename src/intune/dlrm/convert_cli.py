"""``intune data convert IN OUT``: Criteo TSV files (Kaggle ``train.txt``, Terabyte ``day_N``) to Parquet.

Owns the command: it reads each input file through the engine's Criteo TSV reader
(``Pipeline.from_criteo_tsv``, parallel block parsing, errors naming file and line) and writes one
Parquet file per input file with row groups sized for parallel reads. The columns are the reader's:
``label`` int64, ``I1..I13`` float32 (NaN = missing), ``C1..C26`` int64 (-1 = missing); the DLRM
UDFs accept them as they are. It must not parse TSV itself.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from intune.dlrm.data import ROW_GROUP_ROWS


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", help="a Criteo TSV file, a directory of them, or a glob")
    parser.add_argument("output", help="output directory for the Parquet files")
    parser.add_argument("--on-error", choices=("raise", "skip"), default="raise", help="malformed lines")
    parser.add_argument(
        "--row-group-rows", type=int, default=ROW_GROUP_ROWS, help="rows per Parquet row group"
    )
    parser.add_argument("--workers", type=int, default=None, help="parallel parse workers (default: CPUs)")


def input_files(spec: str) -> list[str]:
    """The TSV files named by ``spec``: a file, every plain file in a directory, or a glob."""
    import glob

    path = Path(spec)
    if path.is_dir():
        files = sorted(str(p) for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        if not files:
            raise FileNotFoundError(f"intune data convert: directory {spec!r} holds no files")
        return files
    if glob.has_magic(spec):
        files = sorted(glob.glob(spec))
        if not files:
            raise FileNotFoundError(f"intune data convert: no file matches {spec!r}")
        return files
    if not path.exists():
        raise FileNotFoundError(f"intune data convert: input {spec!r} does not exist")
    return [spec]


def convert_file(
    src: str,
    dst: Path,
    on_error: str = "raise",
    row_group_rows: int = ROW_GROUP_ROWS,
    workers: int | None = None,
) -> int:
    """Convert one TSV file to one Parquet file; return the rows written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from intune.pipeline import Pipeline

    rows = 0
    writer = None
    pipe = Pipeline.from_criteo_tsv([src], chunk_rows=row_group_rows, on_error=on_error).batch(row_group_rows)
    try:
        knob = pipe.knobs.get("read.workers")
        if knob is not None:
            knob.set(knob.clamp(workers or len(os.sched_getaffinity(0))))
        for chunk in pipe:  # deterministic: file order
            table = pa.table(chunk)
            if writer is None:
                writer = pq.ParquetWriter(dst, table.schema, compression="snappy")
            writer.write_table(table)
            rows += table.num_rows
        skipped = pipe.metrics().stages["read"].skipped
        if skipped:
            print(f"{src}: skipped {skipped} malformed line(s)")
    finally:
        pipe.close()
        if writer is not None:
            writer.close()
    if writer is None:  # an empty input still gives a valid, empty file
        from intune.pipeline.criteo import empty_chunk

        pq.write_table(pa.table(empty_chunk()), dst)
    return rows


def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    files = input_files(args.input)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    total = 0
    for src in files:
        dst = out / (Path(src).stem + ".parquet")
        rows = convert_file(src, dst, args.on_error, args.row_group_rows, args.workers)
        total += rows
        print(f"{src} -> {dst}: {rows:,} rows")
    elapsed = time.perf_counter() - start
    print(
        f"converted {len(files)} file(s), {total:,} rows in {elapsed:.1f} s ({total / max(elapsed, 1e-9):,.0f} rows/s)"
    )
    return 0
