"""The live resize of ``intune bench tune`` (2 -> 1 -> 2 CPUs, 45 s each) with the shipped network, the
hold-spell networks and ``steer``, interleaved: the headroom candidate's ``live_resize.py`` with these
variants.

Run from the repository root: ``python benchmarks/candidate-holds/hold-spells/live_resize.py [ROUNDS]``
(the ensemble of the four seeds is read from /tmp/ens0123.pt, made by ``ensemble.py``).
"""

import importlib.util
from pathlib import Path

from intune.agent import policy as agent_policy

HERE = Path(__file__).parent


def main() -> None:
    spec = importlib.util.spec_from_file_location("headroom_live_resize", HERE.parent / "headroom-teacher" / "live_resize.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    runner.VARIANTS.clear()
    runner.VARIANTS.update({
        "intune (shipped)": ("intune", agent_policy.DEFAULT_WEIGHTS),
        "spells seed 2": ("intune", HERE / "seed2.pt"),
        "spells seeds 0-3": ("intune", Path("/tmp/ens0123.pt")),
        "steer": ("steer", None),
    })
    runner.main()


if __name__ == "__main__":
    main()
