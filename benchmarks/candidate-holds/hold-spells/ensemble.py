"""Build the ensemble (mean Q-values, ``EnsembleQNetwork``) of all four seeds of a hold-spell candidate,
``ens0123.pt``, written to the directory given (default /tmp), with the headroom candidate's
``ensemble.py``. All four, not a chosen few: the members are not picked by any benchmark figure.

Run: ``python benchmarks/candidate-holds/hold-spells/ensemble.py [DIR [CANDIDATE]]``: CANDIDATE is the
directory of ``seed0.pt``-``seed3.pt``, this one by default; ``../reachable-spells`` for the reachable
teacher's seeds.
"""

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).parent
SEEDS = (0, 1, 2, 3)
LABELS = {"hold-spells": "hold-spell", "reachable-spells": "reachable hold-spell"}  # as stored in the command


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp")
    members = Path(sys.argv[2]) if len(sys.argv) > 2 else HERE
    spec = importlib.util.spec_from_file_location("headroom_ensemble", HERE.parent / "headroom-teacher" / "ensemble.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    label = LABELS.get(members.resolve().name, members.resolve().name)
    print("wrote", builder.write_ensemble(out / "ens0123.pt", members, SEEDS, label))


if __name__ == "__main__":
    main()
