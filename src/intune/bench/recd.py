"""``intune bench recd``: RecD deduplication end to end, side by side, for session lengths 1..16.

For each mean session length, in one run: storage bytes of the same samples clustered by session vs in
arrival order (Parquet, same codec); preprocessing rows/s of the same UDFs without and with in-batch
deduplication (read -> shuffle -> batch -> [dedup] -> user UDF -> item UDF -> model tensors); training
samples/s of the DLRM on those batches (plain vs dedup-aware, same batch size, same initial weights);
and the held-out AUC of both after the same samples. The plain side shuffles rows; the dedup side
shuffles sessions (RecD's data-loading change) and, by default (``--min-saving 0.1``), leaves a batch
plain where deduplication would remove under 10% of its rows. Length 1 is the control.

The stages run in-process, one after another (a sequential loop over the same map functions the
engine would run), so the ratios measure the work saved, not parallelism. Plain and dedup sides are
advanced in turn, one batch or one training step each, and timed step by step, so that the load of
other processes hits both alike; ratios use this process's CPU seconds by default (``--clock``), and
wall-clock ratios are recorded beside them. AUC is the mean over ``--auc-seeds`` training runs;
"dedup is no worse" is judged on the same held-out rows by a paired bootstrap of AUC(dedup) - AUC(plain).
This module owns the benchmark and its plot; it must not define the transforms or the model.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from intune.bench import md_report
from intune.results import format_table, machine_info, save_figure, write_json

TARGETS = {"storage_ratio": 2.0, "preprocess_ratio": 1.5, "train_ratio": 1.5}  # at mean session length 8
CONTROL_FLOOR = 0.95  # at length 1, dedup may be at most 5% slower
LEARNING_RATE = 0.01
AUC_TOLERANCE = 0.005  # "no worse": the 95% interval of AUC(dedup) - AUC(plain) stays above -this
AUC_LEVEL = 0.95  # of the paired bootstrap's percentile interval
AUC_RESAMPLES = 1000  # bootstrap resamples of the held-out rows
# wall: elapsed time; cpu: CPU seconds of this process, which other processes' load does not inflate
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", help="write results to this JSON file")
    parser.add_argument("--md", help="write the table, the AUC intervals and the targets as Markdown here")
    parser.add_argument("--plot", help="write a PNG of the ratios against session length")
    parser.add_argument("--quick", action="store_true", help="fewer rows (a smoke run, noisier)")
    parser.add_argument("--rows", type=int, help="training rows per session length (default 200k, quick 30k)")
    parser.add_argument("--test-rows", type=int, help="held-out rows (default 50k, quick 10k)")
    parser.add_argument("--session-lens", default="1,2,4,8,16", help="comma-separated mean session lengths")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--window-rows", type=int, default=65_536, help="shuffle window (rows)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads for training")
    parser.add_argument("--device", default="cpu", help="training device: cpu or cuda")
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                        help="time for the ratios: CPU seconds of this process (robust on a shared machine) "
                             "or wall-clock; both are recorded (cuda always uses wall)")
    parser.add_argument("--repeats", type=int, help="timed preprocessing repeats, best kept (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-saving", type=float, default=0.1,
                        help="dedup leaves a batch plain when it would remove less than this fraction of rows "
                             "(0: always encode)")
    parser.add_argument("--auc-seeds", type=int, help="training runs (shuffle and init seeds) averaged for AUC "
                                                        "(default 3, quick 1); only the first is timed")
    parser.add_argument("--auc-resamples", type=int, default=AUC_RESAMPLES,
                        help=f"bootstrap resamples of the held-out rows for the AUC difference (default {AUC_RESAMPLES})")


def _row_shuffle(chunks: Iterator[dict], window_rows: int, seed: int) -> Iterator[dict]:
    """The plain pipeline's shuffle: rows permuted within the same windows as the session shuffle."""
    from intune.recd._chunks import concat_chunks, num_rows, take_rows

    rng = np.random.default_rng([seed, 0])
    pending, held = [], 0
    for chunk in chunks:
        pending.append(chunk)
        held += num_rows(chunk)
        if held >= window_rows:
            window = concat_chunks(pending)
            yield take_rows(window, rng.permutation(held))
            pending, held = [], 0
    if held:
        window = concat_chunks(pending)
        yield take_rows(window, rng.permutation(held))


def preprocess_stream(files: list[str], dedup: bool, batch_size: int, window_rows: int, seed: int,
                      min_saving: float = 0.0) -> Iterator:
    """Read -> shuffle -> batch -> [dedup] -> UDFs -> model batches, lazily (one model batch per next)."""
    from intune.recd import dedup_transform, read_session_chunks, shuffle_sessions
    from intune.recd._chunks import rebatch
    from intune.recd.model import batch_from_chunk
    from intune.recd.preprocess import preprocess_udfs
    from intune.recd.sessions import USER_COLUMNS

    chunks = read_session_chunks(files, chunk_rows=8192)
    if dedup:
        stream = shuffle_sessions(chunks, window_rows, seed=seed)
        maps = [dedup_transform({"user": list(USER_COLUMNS)}, min_saving), *preprocess_udfs()]
    else:
        stream = _row_shuffle(chunks, window_rows, seed)
        maps = preprocess_udfs()
    for batch in rebatch(stream, batch_size):
        for fn in maps:
            batch = fn(batch)
        yield batch_from_chunk(batch)


def preprocess_side_by_side(files: list[str], args: argparse.Namespace, seed: int) -> tuple[dict, dict]:
    """Both pipelines advanced in turn, one batch each, each pull timed on its own: machine noise hits
    both alike. Returns ({(side, clock): best seconds over repeats}, {side: batches of the last repeat}).
    """
    import intune.recd.model  # noqa: F401 - import torch before timing, not inside the first pull
    import intune.recd.preprocess  # noqa: F401

    sides = [(side, clock) for side in ("plain", "dedup") for clock in CLOCKS]
    best = dict.fromkeys(sides, float("inf"))
    batches: dict[str, list] = {}
    for _ in range(args.repeats):
        streams = {side: preprocess_stream(files, side == "dedup", args.batch_size, args.window_rows, seed,
                                           args.min_saving)
                   for side in ("plain", "dedup")}
        spent = dict.fromkeys(sides, 0.0)
        batches = {side: [] for side in streams}
        live = set(streams)
        turn = 0
        while live:
            turn += 1
            for side in sorted(live, reverse=turn % 2 == 0):  # who goes first alternates
                start = {clock: CLOCKS[clock]() for clock in CLOCKS}
                batch = next(streams[side], None)
                for clock, now in CLOCKS.items():
                    spent[side, clock] += now() - start[clock]
                if batch is None:
                    live.discard(side)
                else:
                    batches[side].append(batch)
        best = {key: min(best[key], spent[key]) for key in sides}
    return best, batches


def preprocess(files: list[str], dedup: bool, batch_size: int, window_rows: int, seed: int,
               min_saving: float = 0.0) -> list:
    """All model batches of one pipeline (the held-out set, the untimed AUC seeds)."""
    return list(preprocess_stream(files, dedup, batch_size, window_rows, seed, min_saving))


def _to_device(batch: Any, device: str) -> Any:
    if device == "cpu":
        return batch
    for name in ("user_dense", "user_ids", "history", "history_mask", "items", "label", "inverse"):
        value = getattr(batch, name)
        if value is not None:
            setattr(batch, name, value.to(device, non_blocking=True))
    return batch


def make_model(seed: int, device: str) -> tuple[Any, list]:
    """The DLRM and its optimizers: SparseAdam for the embedding tables, Adam for the rest."""
    import torch

    from intune.recd.model import SessionDLRM

    torch.manual_seed(seed)
    model = SessionDLRM().to(device)
    sparse = [p for n, p in model.named_parameters() if "table" in n]
    dense = [p for n, p in model.named_parameters() if "table" not in n]
    return model, [torch.optim.SparseAdam(sparse, lr=LEARNING_RATE), torch.optim.Adam(dense, lr=LEARNING_RATE)]


def train_side_by_side(batches: dict[str, list], seed: int, device: str) -> tuple[dict, dict, dict]:
    """One pass for each side from the same initial weights, steps interleaved (plain, dedup, plain,
    ...) and timed one by one. The first two steps of each side warm up and are not timed. The
    learning rate decays linearly to a tenth over the pass (outside the timed region).

    Returns ({side: model}, {(side, clock): timed seconds}, {side: timed samples}).
    """
    import torch

    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    models, opts, spent, samples = {}, {}, {}, {}
    for side in batches:
        models[side], opts[side] = make_model(seed, device)
        batches[side] = [_to_device(b, device) for b in batches[side]]
        samples[side] = 0
        for clock in CLOCKS:
            spent[side, clock] = 0.0
    for i in range(max(len(b) for b in batches.values())):
        for side in sorted(batches, reverse=i % 2 == 1):  # who goes first alternates
            if i >= len(batches[side]):
                continue
            batch = batches[side][i]
            sync()
            start = {clock: CLOCKS[clock]() for clock in CLOCKS}
            for opt in opts[side]:
                opt.zero_grad(set_to_none=True)
            models[side].loss(batch).backward()
            for opt in opts[side]:
                opt.step()
            sync()
            if i >= 2:
                for clock, now in CLOCKS.items():
                    spent[side, clock] += now() - start[clock]
                samples[side] += batch.batch_size
            for opt in opts[side]:  # linear decay to 10% over the pass: a steadier final model to compare
                for group in opt.param_groups:
                    group["lr"] = LEARNING_RATE * (1.0 - 0.9 * (i + 1) / len(batches[side]))
    return models, spent, samples


def held_out_labels(batches: list) -> np.ndarray:
    """The labels of the held-out batches, in the order ``predict`` scores them."""
    return np.concatenate([batch.label.cpu().numpy() for batch in batches])


def predict(model: Any, batches: list, device: str) -> np.ndarray:
    """The model's scores for every held-out row, in batch order: both sides score the same rows."""
    import torch

    model.eval()
    scores = []
    with torch.no_grad():
        for batch in batches:
            scores.append(model(_to_device(batch, device)).float().cpu().numpy())
    model.train()
    return np.concatenate(scores)


@dataclass(frozen=True)
class AucDifference:
    """AUC(new) - AUC(base) on all held-out rows, and its bootstrap percentile interval."""

    diff: float
    low: float
    high: float


def paired_auc_difference(labels: Any, scores_new: Any, scores_base: Any, resamples: int = AUC_RESAMPLES,
                          level: float = AUC_LEVEL, seed: int = 0) -> AucDifference:
    """AUC(new) - AUC(base) with a paired bootstrap percentile interval over the held-out rows.

    Paired: each resample of the rows scores both sides, so what they share (which rows are hard to
    rank) cancels in the difference, and the interval is narrower than two independent AUC errors
    whenever the sides' scores are correlated. Stratified: positives and negatives are resampled
    separately, each keeping its count, so every resample has both classes and an AUC. ``scores_*``
    may be (models, rows), one row per training seed: the difference is then the mean over the
    (new, base) pairs of the same seed. The interval covers the held-out rows' sampling noise, not
    the variation between training seeds.
    """
    from intune.dlrm.train import roc_auc

    labels = np.asarray(labels).astype(bool)
    new, base = np.atleast_2d(np.asarray(scores_new)), np.atleast_2d(np.asarray(scores_base))
    if new.shape != base.shape or new.shape[1] != labels.size:
        raise ValueError(f"scores must be (models, rows) alike with {labels.size} rows; got {new.shape} and {base.shape}")
    if resamples < 1 or not 0 < level < 1:
        raise ValueError(f"need resamples >= 1 and 0 < level < 1; got {resamples} and {level}")

    def mean_diff(rows: np.ndarray) -> float:
        y = labels[rows]
        return float(np.mean([roc_auc(y, n[rows]) - roc_auc(y, b[rows]) for n, b in zip(new, base, strict=True)]))

    rng = np.random.default_rng(seed)
    pos, neg = np.flatnonzero(labels), np.flatnonzero(~labels)
    diffs = [mean_diff(np.concatenate([rng.choice(pos, pos.size), rng.choice(neg, neg.size)]))
             for _ in range(resamples)]
    low, high = np.percentile(diffs, [50 * (1 - level), 50 * (1 + level)])
    return AucDifference(mean_diff(np.arange(labels.size)), float(low), float(high))


def run_one(session_len: float, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """All four measurements for one mean session length."""
    from intune.dlrm.train import roc_auc
    from intune.recd.sessions import write_session_dataset

    rows, test_rows = args.rows, args.test_rows
    seed = args.seed + int(session_len * 1000)
    base = workdir / f"len{session_len:g}"
    clustered = write_session_dataset(base / "clustered", rows, seed, session_len, clustered=True)
    # arrival order is written with and without dictionary-encoded lists; the smaller one counts
    arrival = min((write_session_dataset(base / f"arrival{d}", rows, seed, session_len, clustered=False,
                                         dictionary_lists=d) for d in (False, True)), key=lambda s: s["bytes"])
    test = write_session_dataset(base / "test", test_rows, seed + 1, session_len, clustered=True)

    seconds, batches = preprocess_side_by_side(clustered["files"], args, seed)
    test_batches = preprocess(test["files"], False, 8192, args.window_rows, seed)
    unique_rows = sum(b.num_user_rows for b in batches["dedup"])
    models, spent, samples = train_side_by_side(batches, args.seed, args.device)
    scores = {side: [predict(models[side], test_batches, args.device)] for side in models}
    for k in range(1, args.auc_seeds):  # more (shuffle, init) seeds, untimed: AUC varies by ~0.01-0.02
        more = {side: preprocess(clustered["files"], side == "dedup", args.batch_size, args.window_rows, seed + k,
                                 args.min_saving)
                for side in ("plain", "dedup")}
        more_models, _, _ = train_side_by_side(more, args.seed + k, args.device)
        for side in scores:
            scores[side].append(predict(more_models[side], test_batches, args.device))
    labels = held_out_labels(test_batches)
    aucs = {side: [roc_auc(labels, s) for s in scores[side]] for side in scores}
    paired = paired_auc_difference(labels, scores["dedup"], scores["plain"], args.auc_resamples, seed=seed)
    clock = "wall" if args.device != "cpu" or args.clock == "wall" else "cpu"
    speed = {key: samples[key[0]] / spent[key] for key in spent}
    rate = {key: rows / seconds[key] for key in seconds}
    result = {
        "session_len": session_len,
        "storage_ratio": arrival["bytes"] / clustered["bytes"],
        "preprocess_ratio": rate["dedup", clock] / rate["plain", clock],
        "train_ratio": speed["dedup", clock] / speed["plain", clock],
        "auc_dedup": float(np.mean(aucs["dedup"])),
        "auc_plain": float(np.mean(aucs["plain"])),
        "auc_dedup_per_seed": aucs["dedup"],
        "auc_plain_per_seed": aucs["plain"],
        "auc_diff": paired.diff,
        "auc_diff_low": paired.low,
        "auc_diff_high": paired.high,
        "bytes_clustered": clustered["bytes"],
        "bytes_arrival": arrival["bytes"],
        "clock": clock,
        "preprocess_rows_per_s_plain": rate["plain", clock],
        "preprocess_rows_per_s_dedup": rate["dedup", clock],
        "train_samples_per_s_plain": speed["plain", clock],
        "train_samples_per_s_dedup": speed["dedup", clock],
        "preprocess_ratio_wall": rate["dedup", "wall"] / rate["plain", "wall"],
        "train_ratio_wall": speed["dedup", "wall"] / speed["plain", "wall"],
        "preprocess_rows_per_s_plain_wall": rate["plain", "wall"],
        "train_samples_per_s_plain_wall": speed["plain", "wall"],
        "unique_user_fraction": unique_rows / rows,
        "actual_mean_session_len": clustered["mean_session_len"],
        "rows": rows,
    }
    shutil.rmtree(base, ignore_errors=True)
    return result


def check_targets(results: list[dict[str, Any]]) -> list[str]:
    """Which targets a run misses (empty when all are met); lengths not measured are not judged."""
    misses = []
    for r in results:
        if r["session_len"] == 8:
            misses += [f"{k} at length 8 is {r[k]:.2f}, target >= {t}" for k, t in TARGETS.items() if r[k] < t]
        if r["session_len"] == 1:
            misses += [f"{k} at length 1 is {r[k]:.2f}, floor {CONTROL_FLOOR}"
                       for k in ("preprocess_ratio", "train_ratio") if r[k] < CONTROL_FLOOR]
        if r["auc_diff_low"] < -AUC_TOLERANCE:  # dedup no worse: the whole interval above -tolerance
            misses.append(f"AUC dedup - plain is {r['auc_diff']:+.4f}, {AUC_LEVEL:.0%} interval "
                          f"[{r['auc_diff_low']:+.4f}, {r['auc_diff_high']:+.4f}] reaches below -{AUC_TOLERANCE} "
                          f"at length {r['session_len']:g}")
    return misses


def plot(results: list[dict[str, Any]], path: str) -> None:
    """Left: the three ratios against session length, with the targets; right: AUC of both sides."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lens = [r["session_len"] for r in results]
    fig, (ax, ax_auc) = plt.subplots(1, 2, figsize=(10.5, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    for key, label, marker in (("storage_ratio", "storage (arrival / clustered bytes)", "o"),
                               ("preprocess_ratio", "preprocessing rows/s (dedup / plain)", "s"),
                               ("train_ratio", "training samples/s (dedup / plain)", "^")):
        ax.plot(lens, [r[key] for r in results], marker=marker, label=label)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.axhline(CONTROL_FLOOR, color="red", lw=0.6, ls=":", label=f"floor at length 1 ({CONTROL_FLOOR})")
    ax.plot([8], [TARGETS["storage_ratio"]], "o", mfc="none", mec="C0", ms=12, label="targets at length 8")
    ax.plot([8], [TARGETS["train_ratio"]], "s", mfc="none", mec="C2", ms=12)
    for axis in (ax, ax_auc):
        axis.set_xscale("log", base=2)
        axis.set_xticks(lens, [f"{x:g}" for x in lens])
        axis.set_xlabel("mean session length (samples per session)")
    ax.set_ylabel("ratio (higher is better)")
    ax.set_title("RecD in-batch deduplication")
    ax.legend(fontsize=7)
    ax_auc.plot(lens, [r["auc_plain"] for r in results], marker="o", label="plain (row shuffle)")
    ax_auc.plot(lens, [r["auc_dedup"] for r in results], marker="x", label="dedup (session shuffle)")
    ax_auc.set_ylabel("held-out AUC after the same samples")
    ax_auc.set_title("model quality")
    ax_auc.legend(fontsize=7)
    save_figure(fig, path, dpi=120)


def run(args: argparse.Namespace) -> int:
    import torch

    args.rows = args.rows or (30_000 if args.quick else 200_000)
    args.test_rows = args.test_rows or (10_000 if args.quick else 50_000)
    args.repeats = args.repeats or 2
    args.auc_seeds = args.auc_seeds or (1 if args.quick else 3)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    torch.set_num_threads(max(1, args.threads))
    lens = [float(x) for x in args.session_lens.split(",") if x.strip()]
    if not lens or min(lens) < 1:
        raise ValueError(f"--session-lens must be numbers >= 1, got {args.session_lens!r}")
    if args.auc_resamples < 1:
        raise ValueError(f"--auc-resamples must be >= 1, got {args.auc_resamples}")
    results = []
    with tempfile.TemporaryDirectory(prefix="intune-recd-") as tmp:
        for session_len in lens:
            r = run_one(session_len, args, Path(tmp))
            results.append({k: (int(v) if k == "session_len" and float(v).is_integer() else v) for k, v in r.items()})
            print(f"session length {session_len:g}: storage {r['storage_ratio']:.2f}x, preprocessing "
                  f"{r['preprocess_ratio']:.2f}x, training {r['train_ratio']:.2f}x, AUC {r['auc_dedup']:.4f} "
                  f"vs {r['auc_plain']:.4f}", flush=True)
    print(format_table(results, ["session_len", "storage_ratio", "preprocess_ratio", "train_ratio", "auc_dedup",
                                 "auc_plain", "unique_user_fraction", "preprocess_rows_per_s_plain",
                                 "train_samples_per_s_plain"]))
    misses = check_targets(results)
    print("targets: all met" if not misses else "targets missed:\n  " + "\n  ".join(misses))
    settings = {k: getattr(args, k) for k in ("rows", "test_rows", "batch_size", "window_rows", "threads", "device", "clock",
                                              "repeats", "seed", "quick", "auc_seeds", "auc_resamples", "min_saving")}
    if args.json:
        write_json(args.json, results, settings=settings,
                   targets={**TARGETS, "control_floor": CONTROL_FLOOR, "auc_tolerance": AUC_TOLERANCE,
                            "auc_interval_level": AUC_LEVEL},
                   targets_missed=misses)
        print(f"wrote {args.json}")
    if args.plot:
        plot(results, args.plot)
        print(f"wrote {args.plot}")
    if args.md:
        print(f"wrote {md_report.write(args.md, markdown_report(results, settings, misses))}")
    return 0


MD_COLUMNS = ["session_len", "storage_ratio", "preprocess_ratio", "train_ratio", "auc_plain", "auc_dedup",
              "auc_diff", "auc_diff_low", "auc_diff_high", "unique_user_fraction"]


def markdown_report(results: list[dict[str, Any]], settings: dict[str, Any], misses: list[str]) -> str:
    """The command, date and machine; the ratios and the paired AUC intervals per session length; the
    targets missed (the same figures ``--json`` writes)."""
    context = [
        md_report.load_line(),
        f"{settings['rows']:,} training and {settings['test_rows']:,} held-out rows per session length; "
        f"ratios are dedup over plain in {settings['clock']} time (best of {settings['repeats']} timed "
        f"repeats); AUC over {settings['auc_seeds']} training seeds, its difference as a paired bootstrap "
        f"of the held-out rows ({settings['auc_resamples']} resamples, 95% interval).",
    ]
    rows = [{k: r.get(k) for k in MD_COLUMNS} for r in results]
    verdict = ["All targets met."] if not misses else [f"- {m}" for m in misses]
    sections = [
        md_report.section("Per session length", rows=rows, columns=MD_COLUMNS),
        md_report.section("Targets", verdict),
    ]
    return md_report.render(md_report.command_line(("bench", "recd")), machine_info(), context, sections)
