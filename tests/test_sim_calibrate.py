"""``intune sim calibrate``: the prediction from fitted parameters, and (slow) the real run on the engine."""

import pytest

from intune.sim import calibrate


def test_prediction_from_fitted_parameters_by_hand():
    fit = {
        "read": {"cpu": 1e-8, "io": 0.0},
        "burn": {"cpu": 8e-6, "io": 12e-6},
        "wait": {"cpu": 0.0, "io": 8e-6},
    }
    # burn: 2 workers / 20 us = 100k rows/s; wait: 1 worker / 8 us = 125k; CPUs 2 / 8.01 us = 250k
    assert calibrate.predict(fit, 0.0, 0.0, 2, (2, 1)) == pytest.approx(100_000)
    # 8 burn workers, contention 0.1: 8 / 1.7 / 20 us = 235k; wait 2 workers: 250k; CPU bound 249.7k
    assert calibrate.predict(fit, 0.1, 0.0, 2, (8, 2)) == pytest.approx(8 / 1.7 / 20e-6)


def test_median_run_keeps_its_counters():
    runs = [
        {"rows_per_s": 3, "stages": "c"},
        {"rows_per_s": 1, "stages": "a"},
        {"rows_per_s": 2, "stages": "b"},
    ]
    assert calibrate._median_run(runs)["stages"] == "b"


@pytest.mark.slow
def test_calibration_on_the_real_engine(tmp_path):
    from intune.cli import main

    code = main(
        ["sim", "calibrate", "--seconds", "1.5", "--warmup", "0.5", "--json", str(tmp_path / "c.json")]
    )
    assert code == 0  # >= 8 of 10 held-out allocations within +-20%
