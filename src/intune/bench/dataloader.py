"""``intune bench dataloader``: ``intune.DataLoader`` against torch's DataLoader on a per-row dataset.

Owns the benchmark's plan and report. One generated data set (``dataloader_systems.CriteoRows``: a
map-style dataset whose ``__getitem__`` is GIL-bound Python, about 20-30 us a row), then rounds; each
round runs every entry once, each in its own process, the order rotated by one place per round so
that a drift in the shared machine's load does not always land on the same entry. The entries:
``intune.DataLoader`` with ``num_workers="auto"`` under the chosen policy, the same loader untuned
(its starting allocation), torch's DataLoader at every ``num_workers`` of a sweep (persistent
workers: its best setting), the same rows as an iterable dataset that each worker divides by
``get_worker_info()`` (``CriteoStream``) read by ``intune.DataLoader`` with ``num_workers`` = CPUs and by
torch at every ``num_workers`` of the sweep, and the CPU cost of ``__getitem__`` and ``collate`` per
row, from which the CPU bound comes. Every figure is the median and range over rounds; the ratios are per round
(runs of the same round, side by side) and then their median and range. Rows for other loaders of
the same work (``Pipeline.map_rows``, ``to_tf_dataset``) are added in ``EXTRA`` when their APIs
exist. It must not implement a loader or a measurement (``dataloader_systems`` does).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from intune.bench import child, md_report
from intune.bench.dataloader_systems import ITERABLE

FULL = {"rows": 400_000, "measure_rows": 400_000, "cost_batches": 10, "timeout_s": 900}
QUICK = {"rows": 60_000, "measure_rows": 60_000, "cost_batches": 3, "timeout_s": 300}
"""Sizes: the data set's rows (one epoch, timed from a cold start), the rows of the steady window
(the epochs after the first, back to back), the batches over which the CPU costs are measured."""
TARGETS = {
    "vs_torch_cpus": 1.2,
    "vs_torch_best": 1.0,
    "of_bound": 0.85,
    "pss_vs_torch_best": 1.0,
    "iterable_vs_torch_best": 1.0,
}


class Entry(NamedTuple):
    """One run of a round: ``system`` (``intune``, ``torch``, ``costs`` or an ``EXTRA`` name) and its setting."""

    system: str
    setting: str

    @property
    def label(self) -> str:
        return self.system if not self.setting else f"{self.system} ({self.setting})"


EXTRA: dict[str, str] = {}
"""Other loaders of the same work, by name -> what the run measures (filled by ``extra_entries``)."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="a small data set and short runs")
    parser.add_argument("--rounds", type=int, default=3, help="runs of every entry, interleaved (>= 1)")
    parser.add_argument("--json", default=None, help="write the results as JSON here")
    parser.add_argument("--md", default=None, help="write the report as Markdown here")
    parser.add_argument("--batch", type=int, default=4096, help="rows per batch")
    parser.add_argument("--tune", default="intune", help="the policy of intune.DataLoader (default intune)")
    parser.add_argument(
        "--sweep", default=None, help="torch num_workers values, e.g. 1,2,3 (default 1..CPUs+2)"
    )
    parser.add_argument("--rows", type=int, default=None, help="rows of the data set (one epoch)")
    parser.add_argument("--data-dir", default=None, help="where the generated data set is kept")
    parser.add_argument("--extra", action="store_true", help="also run the other loaders in EXTRA")
    parser.add_argument(
        "--no-iterable", dest="iterable", action="store_false",
        help="leave out the iterable dataset's entries (intune and torch's sweep on CriteoStream)",
    )
    parser.add_argument(
        "--memory", action="store_true",
        help="also measure the copy-on-read growth of a dataset of Python strings (dataloader_memory)",
    )
    parser.add_argument("--memory-only", action="store_true", help="measure only the copy-on-read growth")
    parser.add_argument("--memory-rows", type=int, default=None, help="strings in that dataset (default 4,000,000)")


def plan_entries(cpus: float, sweep: Sequence[int], tune: str, extra: bool, iterable: bool = True) -> list[Entry]:
    entries = [Entry("costs", ""), Entry("intune", tune), Entry("intune", "untuned")]
    entries += [Entry("torch", f"num_workers={w}") for w in sweep]
    if iterable:  # an iterable's workers are held (each reads its part): intune at the CPUs, torch swept
        entries.append(Entry("intune" + ITERABLE, f"num_workers={max(1, round(cpus))}"))
        entries += [Entry("torch" + ITERABLE, f"num_workers={w}") for w in sweep]
    if extra:
        entries += [Entry(name, "") for name in extra_entries()]
    return entries


def extra_entries() -> list[str]:
    """The other loaders whose APIs exist in this build (``Pipeline.map_rows``, ``to_tf_dataset``)."""
    from intune.pipeline import Pipeline

    names = []
    if hasattr(Pipeline, "map_rows"):
        names.append("map_rows")
        if hasattr(Pipeline, "to_tf_dataset") and _has("tensorflow"):
            names += ["to_tf_dataset", "tf.data"]
    return names


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def round_order(plan: Sequence[Entry], round_index: int) -> list[Entry]:
    """The plan rotated left by ``round_index`` (each entry takes every position over the rounds)."""
    k = round_index % len(plan) if plan else 0
    return [*plan[k:], *plan[:k]]


def entry_spec(base: Mapping[str, Any], entry: Entry) -> dict[str, Any]:
    spec = {**base, "system": entry.system}
    if entry.system in ("torch", "torch" + ITERABLE, "intune" + ITERABLE):
        spec["num_workers"] = int(entry.setting.split("=", 1)[1])
    elif entry.system == "intune":
        spec["num_workers"] = "auto"
        spec["tune"] = None if entry.setting == "untuned" else entry.setting
    return spec


def run_child(spec: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
    """One run in a fresh process (``python -m intune.bench.dataloader_systems``): its result, or an
    error (exit status and the last lines of its output, or the timeout) instead of raising."""
    return child.run_child('intune.bench.dataloader_systems', spec, timeout_s, {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONWARNINGS": "ignore::UserWarning"})


def run_rounds(
    plan: Sequence[Entry], rounds: int, run_one: Callable[[Entry], dict[str, Any]]
) -> list[dict[str, Any]]:
    """Every entry once per round, in ``round_order``: a row per run."""
    rows = []
    for r in range(rounds):
        for position, entry in enumerate(round_order(plan, r)):
            row = {
                "system": entry.system,
                "setting": entry.setting,
                "round": r,
                "position": position,
                **run_one(entry),
            }
            rows.append(row)
            print(progress_line(row), flush=True)
    return rows


def progress_line(row: Mapping[str, Any]) -> str:
    name = Entry(row["system"], row["setting"]).label
    if "error" in row:
        return f"round {row['round'] + 1}: {name}: ERROR {row['error']}"
    if row["system"] == "costs":
        return f"round {row['round'] + 1}: costs: getitem {row['getitem_us_per_row']:.1f} us/row, collate {row['collate_us_per_row']:.1f} us/row"
    return (
        f"round {row['round'] + 1}: {name}: {row['rows_per_s']:,.0f} rows/s steady, epoch {row['epoch_s']:.2f} s "
        f"from cold, PSS {row['peak_pss_mb']:.0f} MB, workers {row['config'].get('num_workers')}"
    )


# ---- summary -------------------------------------------------------------------------------------
def _runs(results: Sequence[Mapping[str, Any]], system: str, setting: str) -> list[Mapping[str, Any]]:
    return [r for r in results if r["system"] == system and r["setting"] == setting and "error" not in r]


def _by_round(runs: Sequence[Mapping[str, Any]], key: str) -> dict[int, float]:
    return {r["round"]: float(r[key]) for r in runs if r.get(key) is not None}


def spread(values: Sequence[float]) -> dict[str, Any] | None:
    """Median, min, max and count of ``values`` (None when there are none)."""
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def cpu_bound(results: Sequence[Mapping[str, Any]], cpus: float) -> dict[str, Any] | None:
    """CPUs / (``__getitem__`` + collate CPU seconds per row), per costs run."""
    runs = [r for r in results if r["system"] == "costs" and "error" not in r]
    if not runs:
        return None
    per_round = {
        r["round"]: cpus / ((r["getitem_us_per_row"] + r["collate_us_per_row"]) * 1e-6) for r in runs
    }
    return {
        "cpus": cpus,
        "rows_per_s": spread(list(per_round.values())),
        "per_round": per_round,
        "getitem_us_per_row": spread([r["getitem_us_per_row"] for r in runs]),
        "collate_us_per_row": spread([r["collate_us_per_row"] for r in runs]),
    }


def entry_summary(results: Sequence[Mapping[str, Any]], entry: Entry) -> dict[str, Any]:
    runs = _runs(results, entry.system, entry.setting)
    keys = ("rows_per_s", "epoch_s", "first_batch_s", "peak_pss_mb", "peak_uss_mb", "cpu_util")
    return {
        "system": entry.system,
        "setting": entry.setting,
        "runs": len(runs),
        **{k: spread([float(r[k]) for r in runs if r.get(k) is not None]) for k in keys},
    }


def paired(
    results: Sequence[Mapping[str, Any]], a: Entry, b: Entry, key: str, invert: bool = False
) -> dict[str, Any] | None:
    """Per round, ``a``'s figure over ``b``'s (``b`` over ``a`` with ``invert``: for times, so that
    above 1 means ``a`` is better); their median and range."""
    ra, rb = _by_round(_runs(results, *a), key), _by_round(_runs(results, *b), key)
    ratios = [
        (rb[k] / ra[k]) if invert else (ra[k] / rb[k])
        for k in sorted(ra.keys() & rb.keys())
        if ra[k] and rb[k]
    ]
    return spread(ratios)


def best_torch(
    summary: Sequence[Mapping[str, Any]], key: str, highest: bool, system: str = "torch"
) -> Mapping[str, Any] | None:
    """Torch's best sweep entry (of ``system``: ``torch``, or ``torch-iterable``) by the median of ``key``."""
    swept = [s for s in summary if s["system"] == system and s.get(key)]
    if not swept:
        return None
    pick = max if highest else min
    return pick(swept, key=lambda s: s[key]["median"])


def headline(
    results: Sequence[Mapping[str, Any]], summary: Sequence[Mapping[str, Any]], tune: str, cpus: float
) -> dict[str, Any]:
    """The headline figures: the ratios to torch at ``num_workers=CPUs`` and at its best, the fraction of
    the CPU bound, and memory against torch at its best."""
    ours = Entry("intune", tune)
    at_cpus = Entry("torch", f"num_workers={max(1, round(cpus))}")
    fast = best_torch(summary, "rows_per_s", highest=True)
    quick = best_torch(summary, "epoch_s", highest=False)
    fast_entry = Entry("torch", fast["setting"]) if fast else at_cpus
    quick_entry = Entry("torch", quick["setting"]) if quick else at_cpus
    bound = cpu_bound(results, cpus)
    of_bound = None
    if bound is not None:
        rates = _by_round(_runs(results, *ours), "rows_per_s")
        of_bound = spread(
            [rates[k] / bound["per_round"][k] for k in sorted(rates.keys() & bound["per_round"].keys())]
        )
    return {
        "torch_best_rows_per_s": fast_entry.setting,
        "torch_best_epoch_s": quick_entry.setting,
        "rows_per_s_vs_torch_cpus": paired(results, ours, at_cpus, "rows_per_s"),
        "rows_per_s_vs_torch_best": paired(results, ours, fast_entry, "rows_per_s"),
        "epoch_speedup_vs_torch_cpus": paired(results, ours, at_cpus, "epoch_s", invert=True),
        "epoch_speedup_vs_torch_best": paired(results, ours, quick_entry, "epoch_s", invert=True),
        "of_cpu_bound": of_bound,
        "pss_vs_torch_best": paired(results, ours, fast_entry, "peak_pss_mb"),
        **iterable_ratios(results, summary, cpus),
        "cpu_bound": bound,
        "extra": extra_ratios(results, ours),
    }


def iterable_ratios(
    results: Sequence[Mapping[str, Any]], summary: Sequence[Mapping[str, Any]], cpus: float
) -> dict[str, Any]:
    """The iterable dataset's entries: ``intune.DataLoader`` against torch at its best ``num_workers``
    (steady rate, and epoch from cold), and against torch at the same ``num_workers``; empty without them."""
    ours = Entry("intune" + ITERABLE, f"num_workers={max(1, round(cpus))}")
    fast = best_torch(summary, "rows_per_s", highest=True, system="torch" + ITERABLE)
    quick = best_torch(summary, "epoch_s", highest=False, system="torch" + ITERABLE)
    if not _runs(results, *ours) or fast is None or quick is None:
        return {}
    same = Entry("torch" + ITERABLE, ours.setting)
    return {
        "iterable_torch_best_rows_per_s": fast["setting"],
        "iterable_torch_best_epoch_s": quick["setting"],
        "iterable_rows_per_s_vs_torch_best": paired(results, ours, Entry(fast["system"], fast["setting"]), "rows_per_s"),
        "iterable_epoch_speedup_vs_torch_best": paired(
            results, ours, Entry(quick["system"], quick["setting"]), "epoch_s", invert=True
        ),
        "iterable_rows_per_s_vs_torch_same": paired(results, ours, same, "rows_per_s"),
    }


def extra_ratios(results: Sequence[Mapping[str, Any]], ours: Entry) -> dict[str, Any]:
    """``map_rows`` against ``intune.DataLoader``, ``to_tf_dataset`` against the hand-written tf.data
    pipeline: per-round ratios of the steady rate and speed-ups of the epoch from cold."""
    pairs = {"map_rows vs intune.DataLoader": (Entry("map_rows", ""), ours)}
    pairs["to_tf_dataset vs hand-written tf.data"] = (Entry("to_tf_dataset", ""), Entry("tf.data", ""))
    out = {}
    for name, (a, b) in pairs.items():
        if _runs(results, *a) and _runs(results, *b):
            out[name] = {
                "rows_per_s": paired(results, a, b, "rows_per_s"),
                "epoch_speedup": paired(results, a, b, "epoch_s", invert=True),
            }
    return out


# ---- the run -------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    from intune import monitor
    from intune.bench.dataloader_systems import prepare_data
    from intune.dlrm.workload import cache_dir
    from intune.results import format_table, write_json

    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    if args.memory_only:
        return _memory_only(args)
    size = dict(QUICK if args.quick else FULL)
    if args.rows:
        size.update(rows=args.rows, measure_rows=args.rows)
    cpus = monitor.available_cpus()
    sweep = [int(w) for w in args.sweep.split(",")] if args.sweep else list(range(1, int(round(cpus)) + 3))
    data = prepare_data(size["rows"], Path(args.data_dir) if args.data_dir else cache_dir())
    plan = plan_entries(cpus, sweep, args.tune, args.extra, args.iterable)
    load_before = os.getloadavg()
    print(
        f"data: {size['rows']:,} rows under {data}; {cpus:g} CPUs; {len(plan)} runs per round x {args.rounds} rounds; load {load_before[0]:.1f}"
    )
    base = {"data": str(data), "batch_size": args.batch, "seed": 0, "cpus": cpus, "tune": args.tune, **size}
    started = time.perf_counter()
    results = run_rounds(plan, args.rounds, lambda e: run_child(entry_spec(base, e), size["timeout_s"]))
    load_after = os.getloadavg()
    summary = [entry_summary(results, e) for e in plan if e.system != "costs"]
    head = headline(results, summary, args.tune, cpus)
    config = {
        **size,
        "batch_size": args.batch,
        "tune": args.tune,
        "sweep": sweep,
        "rounds": args.rounds,
        "quick": args.quick,
        "iterable": args.iterable,
        "data": str(data),
    }
    load = {
        "before_1min": load_before[0],
        "after_1min": load_after[0],
        "before": load_before,
        "after": load_after,
    }
    extra = {"summary": summary, "headline": head, "config": config, "load": load}
    if args.memory:
        extra["memory"] = _memory(args)
    print(format_table(summary_rows(summary)))
    for line in headline_lines(head):
        print(line)
    print(
        f"total {time.perf_counter() - started:.0f} s; load {load_before[0]:.1f} before, {load_after[0]:.1f} after"
    )
    if args.json:
        print(f"wrote {write_json(args.json, results, **extra)}")
    if args.md:
        from intune.results import machine_info

        payload = {"machine": machine_info(), "results": results, **extra}
        print(
            f"wrote {md_report.write(args.md, markdown_report(payload, md_report.command_line(('bench', 'dataloader'))))}"
        )
    return 0


def _memory(args: argparse.Namespace) -> dict[str, Any]:
    """The copy-on-read rows (``dataloader_memory``): their spec and one row per loader."""
    from intune.bench import dataloader_memory

    spec = {**dataloader_memory.DEFAULTS, **({"rows": args.memory_rows} if args.memory_rows else {})}
    return {"spec": spec, "rows": dataloader_memory.run_memory(spec)}


def _memory_only(args: argparse.Namespace) -> int:
    from intune.bench import dataloader_memory
    from intune.results import machine_info, write_json

    memory = _memory(args)
    if args.json:
        print(f"wrote {write_json(args.json, memory['rows'], spec=memory['spec'])}")
    if args.md:
        section = memory_section(memory)
        text = md_report.render(
            md_report.command_line(("bench", "dataloader")), machine_info(), [md_report.load_line()], [section]
        )
        print(f"wrote {md_report.write(args.md, text)}")
    for line in dataloader_memory.report_lines(memory["spec"], memory["rows"])[1:]:
        print(line)
    return 0 if all("error" not in r for r in memory["rows"]) else 1


def memory_section(memory: Mapping[str, Any]) -> list[str]:
    from intune.bench import dataloader_memory

    return md_report.section(
        "Copy-on-read: a dataset of Python strings in forked workers (pytorch#13246)",
        dataloader_memory.report_lines(memory["spec"], memory["rows"]),
        dataloader_memory.table(memory["rows"]),
    )


# ---- the report ----------------------------------------------------------------------------------
def _fmt(s: Mapping[str, Any] | None, fmt: str = ".3g", scale: float = 1.0) -> str:
    if not s:
        return "-"
    if s["n"] == 1:
        return f"{format(s['median'] * scale, fmt)} (1 run)"
    return f"{format(s['median'] * scale, fmt)} ({format(s['min'] * scale, fmt)}–{format(s['max'] * scale, fmt)}, {s['n']} runs)"


def summary_rows(summary: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    return [
        {
            "loader": Entry(s["system"], s["setting"]).label,
            "steady rows/s": _fmt(s["rows_per_s"], ",.0f"),
            "epoch from cold (s)": _fmt(s["epoch_s"], ".2f"),
            "first batch (s)": _fmt(s["first_batch_s"], ".2f"),
            "peak PSS (MB)": _fmt(s["peak_pss_mb"], ".0f"),
            "CPU use": _fmt(s["cpu_util"], ".2f"),
        }
        for s in summary
    ]


def _met(value: Mapping[str, Any] | None, target: float, lower_is_better: bool = False) -> str:
    if not value:
        return "-"
    ok = value["median"] <= target if lower_is_better else value["median"] >= target
    return "yes" if ok else "no"


def target_rows(head: Mapping[str, Any]) -> list[dict[str, str]]:
    at_cpus, best, epoch_best = (
        "torch (num_workers=CPUs)",
        f"torch ({head['torch_best_rows_per_s']})",
        f"torch ({head['torch_best_epoch_s']})",
    )
    rows = [
        ("steady rows/s vs " + at_cpus, head["rows_per_s_vs_torch_cpus"], TARGETS["vs_torch_cpus"], False),
        (
            "steady rows/s vs " + best + ", torch's best",
            head["rows_per_s_vs_torch_best"],
            TARGETS["vs_torch_best"],
            False,
        ),
        (
            "epoch from cold, speed-up vs " + at_cpus,
            head["epoch_speedup_vs_torch_cpus"],
            TARGETS["vs_torch_cpus"],
            False,
        ),
        (
            "epoch from cold, speed-up vs " + epoch_best + ", torch's best",
            head["epoch_speedup_vs_torch_best"],
            TARGETS["vs_torch_best"],
            False,
        ),
        ("steady rows/s / CPU bound", head["of_cpu_bound"], TARGETS["of_bound"], False),
        ("peak PSS / " + best + "'s", head["pss_vs_torch_best"], TARGETS["pss_vs_torch_best"], True),
    ]
    if head.get("iterable_rows_per_s_vs_torch_best"):
        rows += [
            (
                f"iterable dataset (get_worker_info parts): steady rows/s vs torch ({head['iterable_torch_best_rows_per_s']}), torch's best",
                head["iterable_rows_per_s_vs_torch_best"],
                TARGETS["iterable_vs_torch_best"],
                False,
            ),
            (
                f"iterable dataset: epoch from cold, speed-up vs torch ({head['iterable_torch_best_epoch_s']}), torch's best",
                head["iterable_epoch_speedup_vs_torch_best"],
                TARGETS["iterable_vs_torch_best"],
                False,
            ),
        ]
    return [
        {
            "measurement": name,
            "median (range over rounds)": _fmt(value, ".2f"),
            "target": f"{'<=' if low else '>='} {target:g}",
            "met": _met(value, target, low),
        }
        for name, value, target, low in rows
    ]


def headline_lines(head: Mapping[str, Any]) -> list[str]:
    bound = head.get("cpu_bound")
    lines = [
        f"{r['measurement']}: {r['median (range over rounds)']} (target {r['target']}: {r['met']})"
        for r in target_rows(head)
    ]
    for name, v in (head.get("extra") or {}).items():
        lines.append(
            f"{name}: steady rows/s {_fmt(v['rows_per_s'], '.2f')}, epoch speed-up {_fmt(v['epoch_speedup'], '.2f')}"
        )
    if bound:
        lines.append(
            f"CPU bound: {_fmt(bound['rows_per_s'], ',.0f')} rows/s = {bound['cpus']:g} CPUs / (getitem "
            f"{_fmt(bound['getitem_us_per_row'], '.1f')} + collate {_fmt(bound['collate_us_per_row'], '.1f')} us per row)"
        )
    return lines


def markdown_report(payload: Mapping[str, Any], command: str) -> str:
    config, head, load = payload["config"], payload["headline"], payload["load"]
    context = [
        f"Load average (1 min) before the runs: {load['before_1min']:.1f}; after: {load['after_1min']:.1f} "
        "(the machine is shared: other jobs' load moves the absolute rates; the ratios are per round).",
        f"{config['rounds']} rounds; each runs every entry once, each in its own process, one after another, "
        "the order rotated by one place per round. A figure is the median (min–max) over the rounds; a ratio is "
        "taken per round, between runs of the same round, then its median (min–max).",
        f"Data: {config['rows']:,} generated Criteo-format rows (one epoch), a map-style dataset whose "
        "`__getitem__` does per-row Python (log transforms and buckets of 13 counts, two hashes of 26 hex IDs, "
        f"5 hashed crosses), `shuffle=True`, batches of {config['batch_size']:,} rows collated by torch's "
        "`default_collate`. Epoch from cold: from just before the loader is built to the end of its first epoch "
        "(worker start and tuning included). Steady rate: the next "
        f"{config['measure_rows']:,} rows, over the following epochs back to back. Memory: the process tree's "
        "peak PSS, sampled every 0.5 s over the whole run.",
        f'intune.DataLoader: `num_workers="auto"`, `tune="{config["tune"]}"`; `untuned` is the same loader with '
        "`tune=None` (its starting allocation). torch: `torch.utils.data.DataLoader` with `persistent_workers=True`, "
        f"`num_workers` swept over {config['sweep']}.",
    ]
    if config.get("iterable"):
        context.append(
            "`-iterable` entries: the same rows and per-row work as an `IterableDataset` that each worker divides "
            "by `get_worker_info()` (a contiguous block each, in file order, no shuffle), batches collated by "
            "`default_collate`; intune.DataLoader with `num_workers` = CPUs (an iterable's workers are held: each "
            "reads its part), torch with `persistent_workers=True` over the same sweep."
        )
    summary = payload["summary"]
    bound = head.get("cpu_bound")
    sections = [
        md_report.section("Against the targets", [], target_rows(head)),
        md_report.section("Every loader", [], summary_rows(summary)),
    ]
    if bound:
        sections.append(md_report.section("CPU bound", headline_lines(head)[-1:]))
    traces = [
        f"- round {r['round'] + 1}: {r['config']['workers_per_tick']}"
        for r in payload["results"]
        if r["system"] == "intune" and (r.get("config") or {}).get("workers_per_tick")
    ]
    if traces:
        sections.append(
            md_report.section("intune.DataLoader's workers, one value per tuner tick (1 s)", traces)
        )
    extra = head.get("extra") or {}
    if extra:
        lines = [
            "Entries of the same work through other APIs: `map_rows` is `Pipeline.from_iterable` (shuffled "
            'chunks of the columns) `.map_rows(the same per-row function, mode="process")` `.batch().prefetch()` '
            "under the same policy; `to_tf_dataset` is that pipeline's `to_tf_dataset()`; `tf.data` is a "
            "hand-written pipeline: `range().shuffle().batch()`, each batch's rows fetched by the dataset's "
            "`__getitem__` in `tf.numpy_function` with `num_parallel_calls=AUTOTUNE`, `prefetch(AUTOTUNE)`. "
            "Ratios per round, median (min–max):",
            "",
        ]
        lines += [
            f"- {name}: steady rows/s {_fmt(v['rows_per_s'], '.2f')}; epoch from cold, speed-up {_fmt(v['epoch_speedup'], '.2f')}"
            for name, v in extra.items()
        ]
        sections.append(md_report.section("Other APIs on the same work", lines))
    if payload.get("memory"):
        sections.append(memory_section(payload["memory"]))
    errors = [
        f"- {Entry(r['system'], r['setting']).label}, round {r['round'] + 1}: {r['error']}"
        for r in payload["results"]
        if "error" in r
    ]
    if errors:
        sections.append(md_report.section("Failed runs", errors))
    return md_report.render(command, payload["machine"], context, sections)
