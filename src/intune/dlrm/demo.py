"""``intune demo``: DLRM training fed by the ``dlrm_heavy`` pipeline, tuned live, with a report.

Owns the demo's flow: a cached data set (generated on first use), the engine pipeline under the tuner
(policy ``intune`` when the agent and its weights are installed, else ``plumber``, and it says which),
DLRM training over at most one pass of the data for at most ``--seconds``, with a live terminal view
(rows/s, trainer idle %, each stage's workers and busy %, CPUs, memory), then the held-out AUC and
log-loss beside the base-rate predictor's log-loss, what the tuner did, and the report files (history
as JSON lines, a PNG, a summary JSON). It must not implement policies, the engine or the model.

One pass, because a CTR model's embedding tables memorise the rows they see again. On 2M rows of the
demo's data, one pass (488 steps) reached a held-out AUC of 0.830 and a log-loss of 0.417 (the base
rate's: 0.559); a quarter of a second pass took them to 0.779 and 0.515, and several passes over 500k
rows to a log-loss of 1.00.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

DEMO_ROWS = 2_000_000
"""Training rows of the demo's data set: more than the trainer takes in a minute on a small machine
(one torch thread: 4-13k rows/s on the 2-CPU development machine, loaded or idle), so that the minute
is one pass or less. About 140 MB of Parquet, generated once (about 15 s) and cached."""
DEMO_BATCH = 1024
"""Rows per training batch. The trainer's rows/s is about the same at 1,024 and 4,096 rows (0.079 and
0.075 CPU-s per 1,000 rows), but four times the steps learn more from the same rows: held-out AUC 0.797
after 100k rows against 0.624 at 4,096 (lr 1e-3, embeddings 1e-2, the demo's data)."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seconds", type=float, default=60.0, help="train for this long at most, or one pass (default 60)"
    )
    parser.add_argument("--out", default="intune-out", help="directory for the report (default ./intune-out)")
    parser.add_argument("--rows", type=int, default=DEMO_ROWS, help="training rows of the cached data set")
    parser.add_argument(
        "--policy", default=None, help="policy name (default: intune, the default policy)"
    )
    parser.add_argument("--table-size", type=int, default=50_000, help="embedding rows per table at most")
    parser.add_argument("--batch", type=int, default=DEMO_BATCH, help=f"rows per training batch (default {DEMO_BATCH})")
    parser.add_argument("--no-live", action="store_true", help="print one line per few seconds instead")


def choose_policy(requested: str | None) -> tuple[str, str]:
    """(policy name, why): ``intune`` (the default policy, ``intune.policies.DEFAULT_POLICY``) if it
    builds here, else ``plumber``."""
    if requested:
        return requested, "chosen with --policy"
    try:
        from intune.policies import DEFAULT_POLICY, make

        make("intune")
        return "intune", f"the default: {DEFAULT_POLICY}"
    except Exception as exc:  # noqa: BLE001 - any failure means: not available here
        return (
            "plumber",
            f"the default policy is not available ({type(exc).__name__}: {str(exc)[:80]}); using Plumber",
        )


class LiveView:
    """What the terminal shows, recomputed from metric snapshots (busy % over the last refresh)."""

    def __init__(self, pipe: Any, policy: str, seconds: float) -> None:
        from intune import monitor

        self.pipe = pipe
        self.policy = policy
        self.seconds = seconds
        self.monitor = monitor
        self.start = time.monotonic()
        self._last = pipe.metrics()
        self._busy: dict[str, float] = {}
        self.train: Any = None

    def table(self):
        from rich.table import Table

        now = self.pipe.metrics()
        dt = max(now.time_s - self._last.time_s, 1e-6)
        for name, s in now.stages.items():
            before = self._last.stages.get(name)
            if before is not None and dt > 0.2:
                self._busy[name] = 100.0 * (s.busy_s - before.busy_s) / (dt * max(s.workers, 1))
        if dt > 0.2:
            self._last = now
        used, limit = self.monitor.memory_usage()
        t = self.train
        title = (
            f"intune demo - policy [bold]{self.policy}[/] - {time.monotonic() - self.start:4.0f} / "
            f"{self.seconds:.0f} s"
        )
        table = Table(title=title, show_header=True, header_style="bold")
        table.add_column("stage")
        table.add_column("workers", justify="right")
        table.add_column("busy %", justify="right")
        table.add_column("queue fill", justify="right")
        table.add_column("MB held", justify="right")
        table.add_column("state")
        for name, s in now.stages.items():
            table.add_row(
                name,
                str(s.workers),
                f"{min(self._busy.get(name, 0.0), 100.0):.0f}",
                f"{s.queue_fill:.2f}",
                f"{s.buffered_bytes / 1e6:.1f}",
                f"[bold red]stalled {s.stalled_s:.0f} s[/]" if s.stalled else "",
            )
        table.caption = (
            f"rows/s {now.rows_per_s:,.0f} | trainer idle {t.idle_pct if t else 0:.0f}% | "
            f"loss {t.loss if t else float('nan'):.4f} | CPUs {self.monitor.available_cpus():.1f} | "
            f"memory {used / 2**20:,.0f} / {limit / 2**20:,.0f} MiB"
        )
        return table


def run(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console
    from rich.live import Live

    from intune.dlrm import workload
    from intune.dlrm.train import evaluate, heldout_batches, train
    from intune.history import plot_history, summarize
    from intune.tuner import tune

    console = Console(soft_wrap=True)  # long lines stay whole in logs and pipes
    if args.seconds <= 0:
        raise SystemExit(f"intune demo: --seconds must be positive, got {args.seconds}")
    t_start = time.perf_counter()
    torch.set_num_threads(1)  # leave the other CPUs to the pipeline: the trainer is deliberately light
    dataset = workload.ensure_dataset(args.rows, heldout_rows=min(50_000, max(10_000, args.rows // 10)))
    how = f"generated in {dataset.generated_s:.1f} s" if dataset.generated_s else "from the cache"
    console.print(f"data: {len(dataset.train)} Parquet files under {dataset.root} ({how})")
    udf = workload.make_udf("heavy", dataset.train, table_size=args.table_size)
    policy, why = choose_policy(args.policy)
    console.print(f"policy: [bold]{policy}[/] ({why})")
    pipe = workload.build_pipeline(dataset.train, udf, batch_rows=args.batch)
    tuner = tune(pipe, policy=policy)
    view = LiveView(pipe, policy, args.seconds)
    last_print = [0.0]
    live = None if args.no_live else Live(view.table(), console=console, refresh_per_second=2)

    def on_step(result: Any) -> None:
        view.train = result
        now = time.monotonic()
        if now - last_print[0] < (0.5 if live is not None else 5.0):
            return
        last_print[0] = now
        if live is not None:
            live.update(view.table())
        else:
            m = pipe.metrics()
            knobs = " ".join(f"{k}={v.value}" for k, v in pipe.knobs.items())
            console.print(
                f"{now - view.start:5.0f} s {m.rows_per_s:9,.0f} rows/s  idle {result.idle_pct:3.0f}%  {knobs}"
            )

    try:
        if live is not None:
            live.start()
        result = train(
            workload.epochs(tuner, max_epochs=1),  # one pass at most (the module's docstring says why)
            table_sizes=udf.sparse_sizes,
            max_seconds=args.seconds,
            on_step=on_step,
        )
        if live is not None:
            live.update(view.table())
    finally:
        if live is not None:
            live.stop()
            console.print()
        tuner.close()
    if result.model is None:
        raise SystemExit("intune demo: no batch arrived before the time was up; try a larger --seconds")
    held = heldout_batches(dataset.heldout, udf, batch_rows=8192)
    auc, logloss, eval_rows = evaluate(result.model, held)
    base = base_rate_logloss(dataset.train, np.concatenate([b["label"] for b in held]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    history = tuner.save(out / "demo-history.jsonl")
    rows = tuner.history()
    png = (
        plot_history(rows, out / "demo.png", title=f"intune demo: dlrm_heavy, policy {policy}")
        if rows
        else None
    )
    train_rows = dataset.train_rows
    did = tuner_report(rows, {k: v.value for k, v in pipe.knobs.items()}, result)
    summary = {
        "policy": policy,
        "train": {**result.summary(), "auc": auc, "logloss": logloss, "eval_rows": eval_rows},
        "data_rows": train_rows,
        "base_rate": {"click_rate": base[0], "logloss": base[1]},
        "tuner": {**summarize(rows), **did},
        "final_knobs": {k: v.value for k, v in pipe.knobs.items()},
        "total_s": round(time.perf_counter() - t_start, 1),
    }
    (out / "demo-summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    passes = result.rows / train_rows if train_rows else 0.0
    console.print(
        f"trained {result.steps} steps on {result.rows:,} rows ({passes:.2f} of one pass over {train_rows:,}) "
        f"in {result.seconds:.0f} s; last 50 steps' training loss {result.loss:.4f}"
    )
    console.print(
        f"held-out ({eval_rows:,} rows): AUC {auc:.3f}, log-loss {logloss:.4f}; predicting the click rate "
        f"({base[0]:.3f}) for every row scores log-loss {base[1]:.4f}"
    )
    plot_note = f"report: {png}" if png else "report: none (the tuner did not tick; run longer)"
    console.print(f"{plot_note}  history: {history}  summary: {out / 'demo-summary.json'}")
    console.print(
        f"tuner ({policy}): {did['knob_changes']} knob changes in {did['ticks']} ticks, final "
        f"{did['allocation']}; the pipeline fed {result.rows_per_s:,.0f} rows/s where the trainer could take "
        f"{did['trainer_rows_per_s']:,.0f} (it waited {result.idle_pct:.0f}% of the time)"
    )
    return 0


def base_rate_logloss(train_files: list[Path], heldout_labels: np.ndarray) -> tuple[float, float]:
    """(click rate of the training files, the held-out log-loss of predicting that rate for every row):
    the score a model must beat to have learned anything."""
    import pyarrow.parquet as pq

    from intune.dlrm.data import LABEL
    from intune.dlrm.train import log_loss

    labels = pq.read_table([str(p) for p in train_files], columns=[LABEL]).column(LABEL).to_numpy()
    rate = float(np.mean(labels))
    return rate, log_loss(heldout_labels, np.full(len(heldout_labels), rate))


def tuner_report(history: list[dict[str, Any]], knobs: dict[str, int], result: Any) -> dict[str, Any]:
    """What the tuner did: ticks, knob values it changed (each counted once per tick), the final
    allocation, and the rows/s the trainer could have taken had it never waited (rows / compute time)."""
    workers = [f"{k.removesuffix('.workers')} {v}" for k, v in knobs.items() if k.endswith(".workers")]
    buffers = [f"{k.removesuffix('.buffer_mb')} {v} MB" for k, v in knobs.items() if k.endswith(".buffer_mb")]
    others = [f"{k}={v}" for k, v in knobs.items() if not k.endswith((".workers", ".buffer_mb"))]
    allocation = "workers " + ", ".join(workers)
    if buffers:
        allocation += "; buffers " + ", ".join(buffers)
    if others:
        allocation += "; " + " ".join(others)
    return {
        "ticks": len(history),
        "knob_changes": sum(len(row.get("applied") or {}) for row in history),
        "allocation": allocation,
        "trainer_rows_per_s": result.rows / result.compute_s if result.compute_s > 0 else 0.0,
    }
