"""Build the ensemble (mean Q-values, ``EnsembleQNetwork``) of all four seeds taught by the reachable
teacher with hold spells, ``ens0123.pt``, written to the directory given (default /tmp), with the
headroom candidate's ``ensemble.py``. All four, not a chosen few: the members are not picked by any
benchmark figure.

Run: ``python benchmarks/candidate-holds/reachable-spells/ensemble.py [DIR]``.
"""

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).parent
SEEDS = (0, 1, 2, 3)


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp")
    spec = importlib.util.spec_from_file_location("headroom_ensemble", HERE.parent / "headroom-teacher" / "ensemble.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    print("wrote", builder.write_ensemble(out / "ens0123.pt", HERE, SEEDS, "reachable hold-spell"))


if __name__ == "__main__":
    main()
