"""Session-structured synthetic data for RecD: samples grouped into user sessions.

One user session yields several training samples whose user-side features are identical (that is the
duplication RecD removes), while item-side features vary per sample. This module owns the generator,
the Parquet writer (clustered by session, RecD's data-generation change, or in arrival order, where
concurrent sessions interleave) and a reader that turns Parquet row batches into chunks. It must not
know about deduplication or models.

Schema (one row per sample):
  session_id                      int64   the session the sample belongs to
  label                           int8    click, drawn from a hidden model of the features below
  user_id, user_country, user_device          int64  user categoricals      (repeat within a session)
  user_clicks, user_views, user_days, user_purchases  int64  user counts  (repeat within a session)
  user_history                    list<int64> recently engaged item ids     (repeat within a session)
  item_id, item_category, position            int64  per-sample item features (vary)
In a chunk the list column becomes ``user_history.values`` / ``user_history.lengths``.
"""

from __future__ import annotations

import argparse
import glob
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from intune.hashing import mix64
from intune.recd._chunks import ranges, take_rows

USER_DENSE = ("user_clicks", "user_views", "user_days", "user_purchases")
USER_SPARSE = ("user_id", "user_country", "user_device")
USER_LISTS = ("user_history",)
ITEM_SPARSE = ("item_id", "item_category", "position")
USER_COLUMNS = (*USER_DENSE, *USER_SPARSE, *USER_LISTS)

@dataclass(frozen=True)
class SessionSpec:
    """The shape of the synthetic population; defaults give a click rate near 25%."""

    mean_session_len: float = 8.0  # mean samples per session (1.0 = no duplication)
    session_sigma: float = 1.0  # log-normal sigma of (length - 1): the heavy tail
    max_session_len: int = 1024
    n_users: int = 1_000_000
    n_items: int = 200_000
    n_categories: int = 200
    n_countries: int = 50
    n_devices: int = 6
    mean_history_len: float = 24.0
    max_history_len: int = 64
    max_position: int = 49
    concurrency: int = 10_000  # sessions active at once in arrival order
    codec: str = "zstd"
    row_group_rows: int = 65_536
    dictionary_lists: bool = False  # dictionary-encode list columns (off: zstd sees repeated lists as bytes)


def session_lengths(rows: int, spec: SessionSpec, rng: np.random.Generator) -> np.ndarray:
    """Heavy-tailed session lengths summing to exactly ``rows``.

    length = 1 + floor(Y + U) with Y log-normal of mean (mean - 1) and U uniform in [0, 1): the
    stochastic rounding keeps the mean exact, and mean 1 gives sessions of one sample.
    """
    if rows <= 0:
        raise ValueError(f"rows must be positive, got {rows}")
    if spec.mean_session_len < 1:
        raise ValueError(f"mean_session_len must be >= 1, got {spec.mean_session_len}")
    extra = spec.mean_session_len - 1.0
    out: list[np.ndarray] = []
    total = 0
    while total < rows:
        n = max(16, int((rows - total) / spec.mean_session_len * 1.1) + 16)
        if extra > 0:
            s = spec.session_sigma
            y = extra * np.exp(s * rng.standard_normal(n) - s * s / 2)
            lengths = 1 + np.floor(y + rng.random(n)).astype(np.int64)
        else:
            lengths = np.ones(n, dtype=np.int64)
        lengths = np.minimum(lengths, spec.max_session_len)
        out.append(lengths)
        total += int(lengths.sum())
    lengths = np.concatenate(out)
    ends = np.cumsum(lengths)
    last = int(np.searchsorted(ends, rows))
    lengths = lengths[: last + 1].copy()
    lengths[-1] -= int(ends[last] - rows)
    return lengths


def _items_in_categories(cats: np.ndarray, spec: SessionSpec, rng: np.random.Generator) -> np.ndarray:
    """Item ids of the given categories (item category = item_id mod n_categories), Zipf within one."""
    per_cat = spec.n_items // spec.n_categories
    rank = (rng.zipf(1.3, cats.size) - 1) % per_cat
    return cats + spec.n_categories * rank


def generate_sessions(rows: int, seed: int, spec: SessionSpec) -> dict[str, np.ndarray]:
    """All samples, clustered by session (session ids increase with start time), plus ``_time``."""
    rng = np.random.default_rng(seed)
    lengths = session_lengths(rows, spec, rng)
    n_sessions = lengths.size
    sess_of_row = np.repeat(np.arange(n_sessions, dtype=np.int64), lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    index_in_session = np.arange(rows, dtype=np.int64) - starts[sess_of_row]

    # session-level (user) features
    user_id = rng.integers(0, spec.n_users, n_sessions, dtype=np.int64)
    pref_cat = (mix64(user_id, 1) % np.uint64(spec.n_categories)).astype(np.int64)
    country = (mix64(user_id, 2) % np.uint64(spec.n_countries)).astype(np.int64)
    device = (mix64(user_id, 3) % np.uint64(spec.n_devices)).astype(np.int64)
    activity = rng.standard_normal(n_sessions)
    clicks = np.floor(np.exp(2.0 + 1.0 * activity + 0.5 * rng.standard_normal(n_sessions))).astype(np.int64)
    views = clicks * (1 + rng.poisson(6, n_sessions)) + rng.poisson(3, n_sessions)
    days = rng.integers(1, 3650, n_sessions, dtype=np.int64)
    purchases = rng.poisson(np.maximum(clicks, 0) * 0.05).astype(np.int64)
    hist_len = np.clip(
        np.floor(rng.lognormal(np.log(spec.mean_history_len) - 0.18, 0.6, n_sessions)), 1, spec.max_history_len
    ).astype(np.int64)
    hist_sess = np.repeat(np.arange(n_sessions, dtype=np.int64), hist_len)
    own = rng.random(hist_sess.size) < 0.7
    hist_cat = np.where(own, pref_cat[hist_sess], rng.integers(0, spec.n_categories, hist_sess.size))
    hist_items = _items_in_categories(hist_cat, spec, rng)

    # sample-level (item) features
    own_item = rng.random(rows) < 0.5
    item_cat = np.where(own_item, pref_cat[sess_of_row], rng.integers(0, spec.n_categories, rows))
    item_id = _items_in_categories(item_cat, spec, rng)
    position = np.minimum(index_in_session, spec.max_position)

    # hidden label model: history affinity, preference match, activity, position, popularity
    key_hist = hist_sess * spec.n_categories + hist_cat
    uniq, counts = np.unique(key_hist, return_counts=True)
    key_row = sess_of_row * spec.n_categories + item_cat
    at = np.clip(np.searchsorted(uniq, key_row), 0, uniq.size - 1)
    same_cat = np.where(uniq[at] == key_row, counts[at], 0)
    affinity = same_cat / hist_len[sess_of_row]
    popular = (item_id // spec.n_categories) < 3
    logit = (
        -2.3
        + 1.6 * affinity
        + 0.5 * (item_cat == pref_cat[sess_of_row])
        + 0.4 * activity[sess_of_row]
        - 0.03 * position
        + 0.5 * popular
        + 0.15 * (device[sess_of_row] == 0)
    )
    label = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int8)

    # arrival time: sessions start uniformly over a span giving ~concurrency active sessions
    span = max(rows / max(spec.concurrency, 1), 1e-9)
    session_start = np.sort(rng.random(n_sessions)) * span
    gaps = rng.exponential(1.0, rows)
    gaps[starts] = 0.0
    csum = np.cumsum(gaps)
    time = session_start[sess_of_row] + csum - csum[starts][sess_of_row]

    hist_offsets = np.concatenate([[0], np.cumsum(hist_len)])
    row_hist_len = hist_len[sess_of_row]
    return {
        "session_id": sess_of_row,
        "label": label,
        "user_id": user_id[sess_of_row],
        "user_country": country[sess_of_row],
        "user_device": device[sess_of_row],
        "user_clicks": clicks[sess_of_row],
        "user_views": views[sess_of_row],
        "user_days": days[sess_of_row],
        "user_purchases": purchases[sess_of_row],
        "user_history.values": hist_items[ranges(hist_offsets[sess_of_row], row_hist_len)],
        "user_history.lengths": row_hist_len,
        "item_id": item_id,
        "item_category": item_cat,
        "position": position,
        "_time": time,
    }


def chunk_to_table(chunk: dict[str, np.ndarray]) -> pa.Table:
    """A chunk as an Arrow table: jagged pairs become one list column, ``_``-prefixed columns drop."""
    arrays: dict[str, pa.Array] = {}
    for name, col in chunk.items():
        if name.startswith("_") or name.endswith(".lengths"):
            continue
        if name.endswith(".values"):
            base = name[: -len(".values")]
            offsets = np.concatenate([[0], np.cumsum(chunk[base + ".lengths"])]).astype(np.int32)
            arrays[base] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(col))
        else:
            arrays[name] = pa.array(col)
    return pa.table(arrays)


def table_to_chunk(table: pa.Table | pa.RecordBatch) -> dict[str, np.ndarray]:
    """An Arrow table or record batch as a chunk: list columns become ``.values``/``.lengths``."""
    chunk: dict[str, np.ndarray] = {}
    for name, col in zip(table.column_names, table.columns, strict=True):
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
            offsets = arr.offsets.to_numpy()
            chunk[name + ".values"] = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])).to_numpy()
            chunk[name + ".lengths"] = np.diff(offsets).astype(np.int64)
        else:
            chunk[name] = arr.to_numpy(zero_copy_only=False)
    return chunk


def write_session_dataset(
    out_dir: str | os.PathLike[str],
    rows: int,
    seed: int = 0,
    mean_session_len: float = 8.0,
    clustered: bool = True,
    fmt: str = "parquet",
    rows_per_file: int = 1_000_000,
    **spec_fields: Any,
) -> dict[str, Any]:
    """Generate ``rows`` session samples into ``out_dir`` and return what was written.

    ``clustered=True`` writes each session's samples next to each other (RecD's change to data
    generation); ``False`` writes them in arrival order, interleaved with the concurrent sessions.
    """
    if fmt != "parquet":
        raise ValueError(f"session data is written as Parquet only (list columns); got format {fmt!r}")
    spec = SessionSpec(mean_session_len=mean_session_len, **spec_fields)
    data = generate_sessions(rows, seed, spec)
    if not clustered:
        data = take_rows(data, np.argsort(data["_time"], kind="stable"))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for part, lo in enumerate(range(0, rows, rows_per_file)):
        sel = np.arange(lo, min(rows, lo + rows_per_file))
        path = out / f"part-{part:05d}.parquet"
        table = chunk_to_table(take_rows(data, sel))
        dictionary = [name for name, kind in zip(table.column_names, table.schema.types, strict=True)
                      if spec.dictionary_lists or not pa.types.is_list(kind)]
        pq.write_table(table, path, compression=spec.codec, row_group_size=spec.row_group_rows,
                       use_dictionary=dictionary)
        files.append(str(path))
    n_sessions = int(np.unique(data["session_id"]).size)
    return {
        "rows": rows,
        "sessions": n_sessions,
        "mean_session_len": rows / n_sessions,
        "clustered": clustered,
        "codec": spec.codec,
        "files": files,
        "bytes": sum(os.path.getsize(f) for f in files),
        "click_rate": float(data["label"].mean()),
    }


def read_session_chunks(
    paths: str | Iterable[str], chunk_rows: int = 8192, columns: list[str] | None = None
) -> Iterator[dict[str, np.ndarray]]:
    """Chunks of ``chunk_rows`` rows from Parquet files (a glob or a list), in file order."""
    files = sorted(glob.glob(paths)) if isinstance(paths, str) else list(paths)
    if not files:
        raise ValueError(f"no Parquet files match {paths!r}")
    for path in files:
        try:
            reader = pq.ParquetFile(path)
        except Exception as exc:  # pyarrow raises several types for missing / corrupt files
            raise ValueError(f"cannot read Parquet file {path}: {exc}") from exc
        for batch in reader.iter_batches(batch_size=chunk_rows, columns=columns):
            yield table_to_chunk(batch)


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``intune data generate --sessions`` (the DLRM data command delegates here)."""
    g = parser.add_argument_group("sessions (RecD)")
    g.add_argument("--mean-session-len", type=float, default=8.0, help="mean samples per session (1 = none)")
    g.add_argument("--session-sigma", type=float, default=1.0, help="log-normal sigma of the length tail")
    g.add_argument(
        "--arrival-order",
        action="store_true",
        help="write samples in arrival order (sessions interleaved) instead of clustered by session",
    )
    g.add_argument("--codec", default="zstd", help="Parquet compression codec (same for both orders)")
    g.add_argument("--concurrency", type=int, default=10_000, help="sessions active at once in arrival order")


def write_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Run the generator from parsed CLI options (``--out``, ``--rows``, ``--seed``, ``--format``,
    ``--rows-per-file``) plus those of ``add_cli_arguments``: ``intune data generate --sessions``."""
    extra = {} if getattr(args, "rows_per_file", None) is None else {"rows_per_file": args.rows_per_file}
    return write_session_dataset(
        args.out,
        args.rows,
        seed=getattr(args, "seed", 0),
        mean_session_len=args.mean_session_len,
        clustered=not args.arrival_order,
        fmt=getattr(args, "format", "parquet"),
        session_sigma=args.session_sigma,
        codec=args.codec,
        concurrency=args.concurrency,
        **extra,
    )
