"""``intune demo``: DLRM training fed by the ``dlrm_heavy`` pipeline, tuned live, with a report.

Owns the demo's flow: a small cached data set (generated on first use), the engine pipeline under
the tuner (policy ``intune`` when the agent and its weights are installed, else ``plumber``, and it
says which), DLRM training for ``--seconds`` with a live terminal view (rows/s, trainer idle %, each
stage's workers and busy %, CPUs, memory), then the held-out AUC and the report files (history as
JSON lines, a PNG, a summary JSON). It must not implement policies, the engine or the model.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

DEMO_ROWS = 500_000
"""Training rows of the demo's data set: about 35 MB of Parquet, generated in a few seconds."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to train (default 60)")
    parser.add_argument("--out", default="intune-out", help="directory for the report (default ./intune-out)")
    parser.add_argument("--rows", type=int, default=DEMO_ROWS, help="training rows of the cached data set")
    parser.add_argument(
        "--policy", default=None, help="policy name (default: intune if available, else plumber)"
    )
    parser.add_argument("--table-size", type=int, default=50_000, help="embedding rows per table at most")
    parser.add_argument("--batch", type=int, default=4096, help="rows per training batch")
    parser.add_argument("--no-live", action="store_true", help="print one line per few seconds instead")


def choose_policy(requested: str | None) -> tuple[str, str]:
    """(policy name, why): ``intune`` if the agent imports and its weights load, else ``plumber``."""
    if requested:
        return requested, "chosen with --policy"
    try:
        from intune.policies import make

        make("intune")
        return "intune", "the pretrained InTune agent"
    except Exception as exc:  # noqa: BLE001 - any failure means: not available here
        return (
            "plumber",
            f"the InTune agent is not available ({type(exc).__name__}: {str(exc)[:80]}); using Plumber",
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
            workload.epochs(tuner), table_sizes=udf.sparse_sizes, max_seconds=args.seconds, on_step=on_step
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
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    history = tuner.save(out / "demo-history.jsonl")
    rows = tuner.history()
    png = (
        plot_history(rows, out / "demo.png", title=f"intune demo: dlrm_heavy, policy {policy}")
        if rows
        else None
    )
    summary = {
        "policy": policy,
        "train": {**result.summary(), "auc": auc, "logloss": logloss, "eval_rows": eval_rows},
        "tuner": summarize(rows),
        "final_knobs": {k: v.value for k, v in pipe.knobs.items()},
        "total_s": round(time.perf_counter() - t_start, 1),
    }
    (out / "demo-summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    console.print(
        f"trained {result.steps} steps, {result.rows:,} rows in {result.seconds:.0f} s "
        f"({result.rows_per_s:,.0f} rows/s), trainer idle {result.idle_pct:.0f}%; held-out AUC {auc:.3f}, "
        f"log-loss {logloss:.4f} on {eval_rows:,} rows"
    )
    plot_note = f"report: {png}" if png else "report: none (the tuner did not tick; run longer)"
    console.print(f"{plot_note}  history: {history}  summary: {out / 'demo-summary.json'}")
    console.print(f"total {time.perf_counter() - t_start:.0f} s")
    return 0
