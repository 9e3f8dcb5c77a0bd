"""``intune bench dataloader --memory``: the copy-on-read growth of a dataset of Python strings (pytorch#13246).

A map-style dataset holds ``rows`` Python strings in a list; ``__getitem__`` reads one (its length),
so every epoch touches every string object in whichever worker reads it. Each loader runs in its own
process with 2 persistent workers, batches of 4,096 rows, for 3 epochs: torch's DataLoader,
``intune.DataLoader`` (``tune=None``, the same 2 workers), and ``intune.DataLoader(share_lists=True)``
(the list kept as an ``intune.SharedList``). Measured: the process tree's PSS once the loader is built
and before its workers start (the dataset's own memory, for torch and intune the list, for the opt-in
the shared segment), after the 3 epochs with the workers still alive, and the peak sampled every
0.25 s; the growth is after / before. It must not implement a loader (the loaders are the products').
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from intune.bench import child

SYSTEMS = ("torch", "intune", "intune share_lists=True")
DEFAULTS = {"rows": 4_000_000, "workers": 2, "epochs": 3, "batch_size": 4096, "timeout_s": 1800}
TARGET = 1.2
"""With the opt-in: the tree's PSS after 3 epochs at most this many times its PSS before the workers."""


class Strings:
    """Row ``i`` is the length of the ``i``-th of ``rows`` distinct Python strings (17 characters each)."""

    def __init__(self, rows: int) -> None:
        self.names = [f"row-{i:09d}-{(i * 2654435761) % 1000:03d}" for i in range(rows)]

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: int) -> int:
        return len(self.names[i])


def tree_pss() -> dict[str, int]:
    """The process tree's PSS in bytes (``total``) and its anonymous and shared-memory part (``own``:
    ``Pss_Anon + Pss_Shmem`` of ``/proc/<pid>/smaps_rollup``). The file-backed rest is the libraries'
    pages, whose share moves with how many other processes on the machine map them: on a shared
    machine a forked worker adds to ``total`` without using any new memory."""
    import psutil

    top = psutil.Process()
    total = own = 0
    for proc in [top, *top.children(recursive=True)]:
        try:
            text = Path(f"/proc/{proc.pid}/smaps_rollup").read_text()
        except OSError:  # the process ended meanwhile
            continue
        fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in text.splitlines()[1:]}
        total += fields.get("Pss", 0)
        own += fields.get("Pss_Anon", 0) + fields.get("Pss_Shmem", 0)
    return {"total": total, "own": own}


class _Peak(threading.Thread):
    """The process tree's PSS, sampled every ``period_s`` until ``stop()``: its highest value."""

    def __init__(self, period_s: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.period_s, self.peak, self._done = period_s, 0, threading.Event()
        self.start()

    def run(self) -> None:
        while not self._done.wait(self.period_s):
            self.peak = max(self.peak, tree_pss()["total"])

    def stop(self) -> int:
        self._done.set()
        self.join()
        return self.peak


def measure(spec: Mapping[str, Any]) -> dict[str, Any]:
    """One loader's run: the tree's PSS before its workers start, after ``epochs`` epochs, its peak."""
    import torch

    dataset = Strings(int(spec["rows"]))
    kw = dict(batch_size=int(spec["batch_size"]), num_workers=int(spec["workers"]), persistent_workers=True)
    if spec["system"] == "torch":
        loader: Any = torch.utils.data.DataLoader(dataset, **kw)
    else:
        import intune

        loader = intune.DataLoader(dataset, tune=None, share_lists=spec["system"].endswith("share_lists=True"), **kw)
    gc.collect()
    before = tree_pss()
    peak = _Peak()
    rows = 0
    started = time.perf_counter()
    for _ in range(int(spec["epochs"])):
        for batch in loader:
            rows += len(batch)
    seconds = time.perf_counter() - started
    after = tree_pss()
    highest = max(peak.stop(), after["total"])
    gc.collect()  # a full collection in the training process writes every tracked object's header
    after_gc = tree_pss()
    close = getattr(loader, "close", None)
    if close is not None:
        close()
    return {
        "system": spec["system"],
        "rows_read": rows,
        "seconds": seconds,
        "before_mb": before["total"] / 2**20,
        "after_mb": after["total"] / 2**20,
        "peak_mb": highest / 2**20,
        "growth": after["total"] / before["total"],
        "own_before_mb": before["own"] / 2**20,
        "own_after_mb": after["own"] / 2**20,
        "own_growth": after["own"] / before["own"],
        "after_gc_mb": after_gc["total"] / 2**20,
    }


def run_memory(spec: Mapping[str, Any], systems: Sequence[str] = SYSTEMS) -> list[dict[str, Any]]:
    """Each system in its own fresh process; a failed run is a row with its ``error``."""
    rows = []
    for system in systems:
        row = child.run_child("intune.bench.dataloader_memory", {**spec, "system": system}, spec["timeout_s"])
        row.setdefault("system", system)
        rows.append(row)
        print(progress_line(row), flush=True)
    return rows


def progress_line(row: Mapping[str, Any]) -> str:
    if "error" in row:
        return f"memory, {row['system']}: ERROR {row['error']}"
    return (
        f"memory, {row['system']}: PSS {row['before_mb']:.0f} MB before the workers, {row['after_mb']:.0f} MB after "
        f"the epochs ({row['growth']:.2f}x), peak {row['peak_mb']:.0f} MB; anonymous + shared memory "
        f"{row['own_before_mb']:.0f} -> {row['own_after_mb']:.0f} MB ({row['own_growth']:.2f}x)"
    )


def table(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    return [
        {
            "loader": r["system"],
            "PSS before workers (MB)": "-" if "error" in r else f"{r['before_mb']:.0f}",
            "PSS after epochs (MB)": "-" if "error" in r else f"{r['after_mb']:.0f}",
            "peak PSS (MB)": "-" if "error" in r else f"{r['peak_mb']:.0f}",
            "after / before": r.get("error", "") or f"{r['growth']:.2f}",
            "anon + shmem PSS before / after (MB)": "-" if "error" in r else f"{r['own_before_mb']:.0f} / {r['own_after_mb']:.0f}",
            "anon + shmem after / before": "-" if "error" in r else f"{r['own_growth']:.2f}",
            "after gc.collect() (MB)": "-" if "error" in r else f"{r['after_gc_mb']:.0f}",
        }
        for r in rows
    ]


def report_lines(spec: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The section's text: the setting, and the opt-in against its target and torch's growth."""
    lines = [
        f"A map-style dataset holding {spec['rows']:,} Python strings in a list, `__getitem__` reading one; "
        f"{spec['workers']} persistent forked workers, batches of {spec['batch_size']:,}, {spec['epochs']} epochs; "
        "each loader in its own process (intune untuned, so both have the same workers). PSS of the process "
        "tree: once the loader is built, before its workers start; after the epochs, the workers alive; the "
        "peak sampled every 0.25 s. Last, after a `gc.collect()` in the training process: a full collection "
        "writes the header of every object it tracks (torch's modules, for one), so the pages it shares with "
        "the workers since their fork are copied, for every loader alike.",
    ]
    by = {r["system"]: r for r in rows if "error" not in r}
    shared, torch_row = by.get(SYSTEMS[2]), by.get("torch")
    if shared is not None:
        met = "met" if shared["growth"] <= TARGET else "missed"
        own_met = "met" if shared["own_growth"] <= TARGET else "missed"
        text = (
            f"Growth of the tree's PSS, after / before: share_lists=True {shared['growth']:.2f}x (target <= {TARGET}x: "
            f"{met}); its anonymous + shared-memory part {shared['own_growth']:.2f}x ({own_met})"
        )
        if torch_row is not None:
            text += f"; torch's DataLoader {torch_row['growth']:.2f}x ({torch_row['own_growth']:.2f}x)"
        if SYSTEMS[1] in by:
            text += f"; intune.DataLoader without the opt-in {by[SYSTEMS[1]]['growth']:.2f}x ({by[SYSTEMS[1]]['own_growth']:.2f}x)"
        lines.append(
            text + ". The file-backed part of PSS is the libraries' pages (torch's, Python's), whose share moves "
            "with the other processes on the machine that map them: each forked worker adds to it without new memory."
        )
    return lines


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    import torch  # noqa: F401 - a training script has it loaded before it builds a loader

    Path(argv[1]).write_text(json.dumps(measure(spec)))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore::UserWarning")
    sys.exit(main(sys.argv[1:]))
