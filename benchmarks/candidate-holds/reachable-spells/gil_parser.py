"""The remote-pool behaviour test the candidate fails, traced: `tests/test_policies_remote.py::
test_no_remote_workers_without_a_demand_behind_a_bottleneck_they_cannot_relieve` (a GIL-bound thread
parser caps the pipeline at 500k rows/s; a remote UDF worker adds no row), with the shipped network,
the 4-seed ensemble and seed 0. Knob values and model rows/s at some ticks.

    python benchmarks/candidate-holds/reachable-spells/gil_parser.py /tmp/ens0123.pt > .../gil_parser.txt
"""

import sys
from pathlib import Path

from intune.policies import make
from intune.sim import Simulator
from intune.sim.episode import run_episode

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "tests"))
from test_policies_remote import _spec  # noqa: E402  (the test's own pipeline)

PARSE = {"name": "parse", "kind": "map", "mode": "thread", "cpu_us_per_row": 2.0, "gil_fraction": 1.0}


def main() -> None:
    for label, weights in (("shipped", None), ("ensemble of seeds 0-3", sys.argv[1]), ("seed 0", str(HERE / "seed0.pt"))):
        sim = Simulator(_spec(udf_cost=4.0, read=PARSE), seed=0)
        r = run_episode(sim, make("intune") if weights is None else make("intune", weights=weights), 150)
        print(f"{label}: remote UDF workers after tick 20, most {int(r.knobs['udf.remote_workers'][20:].max())} (the test asks 0)")
        for t in (0, 10, 20, 25, 40, 60, 100, 149):
            knobs = ", ".join(f"{k} {int(v[t])}" for k, v in r.knobs.items())
            print(f"  tick {t}: {r.model_throughput[t]:,.0f} rows/s; {knobs}")


if __name__ == "__main__":
    main()
