"""`intune demo` end to end on a tiny data set: it trains, tunes, and writes its report."""

from __future__ import annotations

import json
import math
import time

import pytest

from intune.cli import main
from intune.dlrm import demo

DEMO_ROWS = 100_000
DEMO_BATCH = 1024
ONE_PASS_STEPS = -(-DEMO_ROWS // DEMO_BATCH)  # 98: 97 full batches and the epoch's last, partial one


@pytest.fixture
def whole_pass(monkeypatch):
    """The demo trains its whole pass, however loaded the machine, and for no less than its ``--seconds``
    (so that the tuner ticks). Left to its clock, 3 s gave from 2 steps to more than a pass by the load."""
    from intune.dlrm import train as train_module

    real_train = train_module.train

    def train(batches, *args, max_seconds, **kwargs):
        start = time.monotonic()

        def then_idle():
            yield from batches
            while time.monotonic() - start < max_seconds:  # the trainer idles, the tuner keeps ticking
                time.sleep(0.05)

        return real_train(then_idle(), *args, max_seconds=120.0, **kwargs)  # 120 s: a hang bound

    monkeypatch.setattr(train_module, "train", train)


def test_demo_trains_one_pass_beats_the_base_rate_and_reports_the_tuner(
    tmp_path, monkeypatch, capsys, whole_pass
) -> None:
    monkeypatch.setenv("INTUNE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    args = ["demo", "--seconds", "3", "--rows", str(DEMO_ROWS), "--table-size", "2000", "--batch", str(DEMO_BATCH)]
    assert main([*args, "--out", str(out), "--no-live", "--policy", "heuristic"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert "policy: heuristic" in "\n".join(printed)
    summary = json.loads((out / "demo-summary.json").read_text())
    assert summary["policy"] == "heuristic"
    # one pass: every row once, and no second pass (which overfits: the held-out log-loss rises)
    assert summary["train"]["rows"] == DEMO_ROWS
    assert summary["train"]["steps"] == ONE_PASS_STEPS
    assert summary["train"]["eval_rows"] == 10_000
    # the model beats the base-rate predictor, whose log-loss is the click rate's entropy on held-out rows
    rate, base = summary["base_rate"]["click_rate"], summary["base_rate"]["logloss"]
    assert 0.2 < rate < 0.3 and base == pytest.approx(-(rate * math.log(rate) + (1 - rate) * math.log(1 - rate)), abs=0.01)
    assert summary["train"]["logloss"] < base - 0.02
    assert summary["train"]["auc"] > 0.7  # chance is 0.5
    held_out = next(line for line in printed if line.startswith("held-out"))
    assert f"log-loss {summary['train']['logloss']:.4f}" in held_out and f"log-loss {base:.4f}" in held_out
    # the last line says what the tuner did, from its history
    ticks = [json.loads(line) for line in (out / "demo-history.jsonl").read_text().splitlines()]
    assert ticks and "udf.workers" in ticks[0]["knobs"]
    changes = sum(len(t["applied"]) for t in ticks)
    assert printed[-1].startswith(f"tuner (heuristic): {changes} knob changes in {len(ticks)} ticks, final workers read ")
    assert "rows/s where the trainer could take" in printed[-1]
    assert (out / "demo.png").stat().st_size > 10_000
    # a second run finds the data set in the cache
    from intune.dlrm import workload

    assert workload.ensure_dataset(DEMO_ROWS, heldout_rows=10_000).generated_s == 0.0


def test_policy_choice_falls_back_to_plumber_and_says_why() -> None:
    name, why = demo.choose_policy(None)
    assert name in ("intune", "plumber")
    if name == "plumber":
        assert "not available" in why
    assert demo.choose_policy("heuristic") == ("heuristic", "chosen with --policy")


def test_bad_seconds() -> None:
    with pytest.raises(SystemExit, match="--seconds must be positive"):
        main(["demo", "--seconds", "0"])
