"""``intune data generate``: write synthetic Criteo-format data (Parquet or TSV).

Owns the command's options and its printed summary; the generator itself lives in ``intune.dlrm.data``.
With ``--sessions`` it hands over to the RecD session generator (``intune.recd.sessions``), whose
options it adds when that module is present. It must not generate data itself.
"""

from __future__ import annotations

import argparse
import importlib
import os
import time
from types import ModuleType

SESSIONS_MODULE = "intune.recd.sessions"


def _sessions_module() -> ModuleType | None:
    try:
        return importlib.import_module(SESSIONS_MODULE)
    except ImportError:
        return None


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, required=True, help="number of rows to write")
    parser.add_argument("--out", required=True, help="output directory (created if missing)")
    parser.add_argument("--format", choices=("parquet", "tsv"), default="parquet", help="file format")
    parser.add_argument("--seed", type=int, default=0, help="data seed (the hidden label model is fixed)")
    parser.add_argument("--rows-per-file", type=int, default=None, help="rows per output file")
    parser.add_argument(
        "--sessions",
        action="store_true",
        help=f"session-structured data for RecD (delegates to {SESSIONS_MODULE})",
    )
    sessions = _sessions_module()
    if sessions is not None and hasattr(sessions, "add_cli_arguments"):
        sessions.add_cli_arguments(parser)


def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    if args.sessions:
        sessions = _sessions_module()
        if sessions is None or not hasattr(sessions, "write_from_args"):
            raise SystemExit(
                f"intune data generate --sessions: the RecD session generator ({SESSIONS_MODULE}."
                "write_from_args) is not available in this installation"
            )
        summary = sessions.write_from_args(args)
        elapsed = time.perf_counter() - start
        print(f"wrote {summary.get('rows', args.rows):,} session rows to {args.out} in {elapsed:.1f} s")
        for key, value in summary.items():
            if key != "files":
                print(f"  {key}: {value}")
        return 0

    from intune.dlrm import data

    kwargs = {} if args.rows_per_file is None else {"rows_per_file": args.rows_per_file}
    paths = data.generate(args.rows, args.out, fmt=args.format, seed=args.seed, **kwargs)
    elapsed = time.perf_counter() - start
    size = sum(os.path.getsize(p) for p in paths)
    print(
        f"wrote {args.rows:,} rows in {len(paths)} {args.format} file(s) to {args.out} "
        f"({size / 1e6:.1f} MB) in {elapsed:.1f} s ({args.rows / max(elapsed, 1e-9):,.0f} rows/s)"
    )
    return 0
