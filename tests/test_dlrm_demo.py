"""`intune demo` end to end on a tiny data set: it trains, tunes, and writes its report."""

from __future__ import annotations

import json
import time

import pytest

from intune.cli import main
from intune.dlrm import demo

# Three passes over the 20,000 rows. The held-out AUC is a function of the step count (the same value
# run after run): 0.53 at 20 steps, 0.69 at 40, 0.715 at 60 and 80, 0.67 at 120 and 160.
DEMO_STEPS = 60


@pytest.fixture
def fixed_steps(monkeypatch):
    """The demo trains exactly ``DEMO_STEPS`` steps, and for no less than its ``--seconds`` (so the tuner
    ticks). Left to its clock, 3 s gave 2 to 124 steps and an AUC of 0.50 to 0.72 by the machine's load."""
    from intune.dlrm import train as train_module

    real_train = train_module.train

    def train(batches, *args, max_seconds, **kwargs):
        start = time.monotonic()

        def first_steps():
            for step, batch in enumerate(batches, start=1):
                yield batch
                if step == DEMO_STEPS:
                    break
            while time.monotonic() - start < max_seconds:  # the trainer idles, the tuner keeps ticking
                time.sleep(0.05)

        return real_train(first_steps(), *args, max_seconds=120.0, **kwargs)  # 120 s: a hang bound

    monkeypatch.setattr(train_module, "train", train)


def test_demo_writes_history_plot_and_summary(tmp_path, monkeypatch, capsys, fixed_steps) -> None:
    monkeypatch.setenv("INTUNE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    args = ["demo", "--seconds", "3", "--rows", "20000", "--table-size", "2000", "--batch", "1024"]
    assert main([*args, "--out", str(out), "--no-live", "--policy", "heuristic"]) == 0
    printed = capsys.readouterr().out
    assert "policy: heuristic" in printed and "held-out AUC" in printed
    summary = json.loads((out / "demo-summary.json").read_text())
    assert summary["policy"] == "heuristic"
    assert summary["train"]["steps"] == DEMO_STEPS
    assert summary["train"]["auc"] > 0.65  # measured 0.715, the same every run; chance is 0.5
    assert summary["train"]["eval_rows"] == 10_000
    assert (out / "demo.png").stat().st_size > 10_000
    ticks = (out / "demo-history.jsonl").read_text().splitlines()
    assert ticks and "udf.workers" in json.loads(ticks[0])["knobs"]
    # a second run finds the data set in the cache
    from intune.dlrm import workload

    assert workload.ensure_dataset(20_000, heldout_rows=10_000).generated_s == 0.0

def test_policy_choice_falls_back_to_plumber_and_says_why() -> None:
    name, why = demo.choose_policy(None)
    assert name in ("intune", "plumber")
    if name == "plumber":
        assert "not available" in why
    assert demo.choose_policy("heuristic") == ("heuristic", "chosen with --policy")


def test_bad_seconds() -> None:
    with pytest.raises(SystemExit, match="--seconds must be positive"):
        main(["demo", "--seconds", "0"])
