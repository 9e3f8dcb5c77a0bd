"""The DLRM workload as the demo and the real benchmark run it: cached data, UDF, engine pipeline.

Owns the cache of generated data sets (``$INTUNE_CACHE`` or ``~/.cache/intune``), the choice of the
vocabulary sample, and the one pipeline shape (read -> shuffle -> udf -> batch -> prefetch) so that
``intune demo`` and ``intune bench real`` measure the same thing. It must not pick knob values (the
tuner and its policies do) nor train.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from intune.dlrm import data
from intune.dlrm.pipelines import DEFAULT_TABLE_SIZE, DlrmHeavy, DlrmStandard, dlrm_heavy, dlrm_standard

HELDOUT_SEED_OFFSET = 1_000
"""The held-out set uses ``seed + HELDOUT_SEED_OFFSET``: other rows, the same hidden model."""


def cache_dir() -> Path:
    """Where generated data sets are kept between runs."""
    root = os.environ.get("INTUNE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "intune")
    return Path(root)


@dataclass(frozen=True)
class Dataset:
    root: Path
    train: list[Path]
    heldout: list[Path]
    generated_s: float  # 0 when it came from the cache

    @property
    def train_rows(self) -> int:
        import pyarrow.parquet as pq

        return sum(pq.ParquetFile(p).metadata.num_rows for p in self.train)


def ensure_dataset(rows: int, heldout_rows: int = 50_000, seed: int = 0, root: Path | None = None) -> Dataset:
    """The cached data set of ``rows`` training rows, generated on first use (a marker says complete)."""
    base = (root or cache_dir()) / f"criteo-synth-{rows}-{heldout_rows}-seed{seed}"
    marker = base / "COMPLETE"
    start = time.perf_counter()
    generated = 0.0
    if not marker.exists():
        data.generate(rows, base / "train", seed=seed)
        data.generate(heldout_rows, base / "heldout", seed=seed + HELDOUT_SEED_OFFSET)
        marker.write_text(f"rows={rows} heldout={heldout_rows} seed={seed}\n")
        generated = time.perf_counter() - start
    return Dataset(base, data.data_files(base / "train"), data.data_files(base / "heldout"), generated)


def vocabulary_sample(files: list[Path], rows: int = 65_536) -> dict[str, np.ndarray]:
    """The first ``rows`` rows of the training files: where ``dlrm_heavy`` learns its frequent IDs."""
    return next(data.read_chunks(files[:1], rows))


def make_udf(kind: str, files: list[Path], table_size: int = DEFAULT_TABLE_SIZE) -> DlrmHeavy | DlrmStandard:
    """``heavy`` (row-by-row Python, vocabularies from the training files) or ``standard``."""
    if kind == "heavy":
        return dlrm_heavy(vocabulary_sample(files), table_size=table_size)
    if kind == "standard":
        return dlrm_standard(table_size)
    raise ValueError(f"unknown UDF {kind!r}; use 'heavy' or 'standard'")


def build_pipeline(
    files: list[Path],
    udf: Any,
    batch_rows: int = 4096,
    chunk_rows: int = 4096,
    shuffle_rows: int = 65_536,
    mode: str = "process",
    seed: int = 0,
    **options: Any,
):
    """read -> shuffle -> udf -> batch -> prefetch on the engine, every pool at one worker to start."""
    from intune.pipeline import Pipeline

    return (
        Pipeline.from_parquet([str(p) for p in files], chunk_rows=chunk_rows, **options)
        .shuffle(buffer_rows=shuffle_rows, seed=seed)
        .map(udf, name="udf", mode=mode)
        .batch(batch_rows)
        .prefetch(depth=4)
    )


def epochs(pipe: Any, max_epochs: int | None = None):
    """Batches over repeated epochs of ``pipe`` (or of a tuner wrapping it)."""
    done = 0
    while max_epochs is None or done < max_epochs:
        yield from pipe
        done += 1
