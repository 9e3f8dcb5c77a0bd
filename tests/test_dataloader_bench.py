"""``intune bench dataloader``: the same per-row work in every API, ratios paired by round, the report."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from intune.bench import dataloader as bench
from intune.bench.dataloader_systems import CriteoRows, RowFunction, prepare_data
from intune.cli import build_parser


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> CriteoRows:
    return CriteoRows(prepare_data(300, tmp_path_factory.mktemp("criteo-rows")))


def test_every_api_does_the_same_per_row_work(rows: CriteoRows) -> None:
    """``map_rows``' row function gives what ``__getitem__`` gives, and the dataset pickles as its
    directory (workers reopen the memory-mapped columns, nothing is copied)."""
    fn = RowFunction(rows.salts, rows.table_size)
    for i in (0, 7, 299):
        a = rows[i]
        b = fn({"dense": rows.dense[i], "ids": rows.ids[i], "label": rows.label[i]})
        assert a.keys() == b.keys()
        for key in ("dense", "buckets", "sparse"):
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key
        assert a["label"] == b["label"]
    blob = pickle.dumps(rows)
    assert len(blob) < 500
    again = pickle.loads(blob)
    assert np.array_equal(again[5]["sparse"], rows[5]["sparse"])
    assert len(rows[3]["sparse"]) == 2 * 26 + 5 and len(rows[3]["dense"]) == 13


def run(system: str, setting: str, r: int, rate: float, epoch: float, pss: float = 300.0) -> dict:
    return {
        "system": system,
        "setting": setting,
        "round": r,
        "rows_per_s": rate,
        "epoch_s": epoch,
        "first_batch_s": 0.1,
        "peak_pss_mb": pss,
        "peak_uss_mb": pss / 2,
        "cpu_util": 0.9,
        "config": {"num_workers": 2, "workers_per_tick": [2, 2]},
    }


def test_ratios_pair_runs_of_the_same_round_and_take_torchs_best() -> None:
    results = [
        {"system": "costs", "setting": "", "round": r, "getitem_us_per_row": 15.0, "collate_us_per_row": 5.0}
        for r in range(3)
    ]
    for r, (ours, two, three) in enumerate([(100, 80, 90), (60, 50, 70), (120, 100, 95)]):
        results += [
            run("intune", "intune", r, ours, 10.0, pss=290),
            run("torch", "num_workers=2", r, two, 12.0),
            run("torch", "num_workers=3", r, three, 11.0, pss=350),
        ]
    results.append({"system": "torch", "setting": "num_workers=3", "round": 3, "error": "timed out"})
    plan = [
        bench.Entry("intune", "intune"),
        bench.Entry("torch", "num_workers=2"),
        bench.Entry("torch", "num_workers=3"),
    ]
    summary = [bench.entry_summary(results, e) for e in plan]
    head = bench.headline(results, summary, "intune", cpus=2.0)
    assert head["torch_best_rows_per_s"] == "num_workers=3"  # median 90 against 80
    assert head["torch_best_epoch_s"] == "num_workers=3"
    vs_cpus = head["rows_per_s_vs_torch_cpus"]
    assert (
        vs_cpus["n"] == 3 and vs_cpus["median"] == pytest.approx(1.2) and vs_cpus["min"] == pytest.approx(1.2)
    )
    best = head["rows_per_s_vs_torch_best"]
    assert best["min"] == pytest.approx(60 / 70) and best["max"] == pytest.approx(120 / 95)
    assert head["epoch_speedup_vs_torch_best"]["median"] == pytest.approx(1.1)
    assert head["of_cpu_bound"]["median"] == pytest.approx(100 / 100_000)  # 2 CPUs / 20 us = 100k rows/s
    assert head["pss_vs_torch_best"]["median"] == pytest.approx(290 / 350)
    rows = {r["measurement"]: r for r in bench.target_rows(head)}
    assert rows["steady rows/s vs torch (num_workers=CPUs)"]["met"] == "yes"
    assert rows["steady rows/s / CPU bound"]["met"] == "no"
    payload = {
        "machine": {"usable_cpus": 2, "host_cpus": 2},
        "results": results,
        "summary": summary,
        "headline": head,
        "config": {
            "rounds": 3,
            "rows": 1000,
            "batch_size": 64,
            "measure_rows": 1000,
            "tune": "intune",
            "sweep": [2, 3],
        },
        "load": {"before_1min": 1.5, "after_1min": 2.5},
    }
    text = bench.markdown_report(payload, "intune bench dataloader")
    assert "before the runs: 1.5; after: 2.5" in text and "1.20 (1.20–1.20, 3 runs)" in text
    assert "torch (num_workers=3), round 4: timed out" in text


def test_the_command_is_registered() -> None:
    args = build_parser().parse_args(["bench", "dataloader"])
    assert args._module == "intune.bench.dataloader"


def test_the_iterable_rows_are_each_workers_block_once(rows: CriteoRows) -> None:
    """``CriteoStream`` gives the same rows as ``__getitem__``, each once over the workers' blocks,
    through torch's loader and intune's alike (so the iterable entries do the same work)."""
    import torch

    import intune
    from intune.bench.dataloader_systems import CriteoStream

    stream = CriteoStream(rows.root)
    assert [s["label"] for s in stream] == [rows[i]["label"] for i in range(len(rows))]
    theirs = torch.utils.data.DataLoader(stream, batch_size=32, num_workers=3)
    with intune.DataLoader(stream, batch_size=32, num_workers=3, tune=None) as ours:
        a = torch.cat([b["sparse"] for b in theirs])
        b = torch.cat([b["sparse"] for b in ours])
    assert a.shape[0] == len(rows) and torch.equal(a, b)


def test_the_iterable_entries_pair_with_torchs_best_iterable_setting() -> None:
    results = []
    for r, (ours, one, two) in enumerate([(100, 60, 90), (80, 50, 70), (120, 70, 100)]):
        results += [
            run("intune", "intune", r, 100, 10.0),
            run("torch", "num_workers=2", r, 90, 12.0),
            run("intune-iterable", "num_workers=2", r, ours, 8.0),
            run("torch-iterable", "num_workers=1", r, one, 9.0),
            run("torch-iterable", "num_workers=2", r, two, 10.0),
        ]
    plan = bench.plan_entries(2.0, [1, 2], "intune", extra=False)
    assert bench.Entry("intune-iterable", "num_workers=2") in plan
    assert bench.Entry("torch-iterable", "num_workers=1") in plan
    assert bench.entry_spec({}, bench.Entry("intune-iterable", "num_workers=2"))["num_workers"] == 2
    summary = [bench.entry_summary(results, e) for e in plan if e.system != "costs"]
    head = bench.headline(results, summary, "intune", cpus=2.0)
    assert head["iterable_torch_best_rows_per_s"] == "num_workers=2"  # median 90 against 60
    assert head["iterable_torch_best_epoch_s"] == "num_workers=1"  # 9 s against 10 s
    assert head["iterable_rows_per_s_vs_torch_best"]["median"] == pytest.approx(80 / 70)  # per round: 1.11, 1.14, 1.2
    assert head["iterable_epoch_speedup_vs_torch_best"]["median"] == pytest.approx(9 / 8)
    names = [r["measurement"] for r in bench.target_rows(head)]
    assert any(n.startswith("iterable dataset (get_worker_info parts): steady rows/s vs torch (num_workers=2)") for n in names)
    assert bench.plan_entries(2.0, [1, 2], "intune", extra=False, iterable=False)[-1] == bench.Entry("torch", "num_workers=2")
