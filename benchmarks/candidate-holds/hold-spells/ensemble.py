"""Build the ensemble (mean Q-values, ``EnsembleQNetwork``) of all four hold-spell seeds, ``ens0123.pt``,
written to the directory given (default /tmp). All four, not a chosen few: the members are not picked
by any benchmark figure.

Run: ``python benchmarks/candidate-holds/hold-spells/ensemble.py [DIR]``.
"""

import sys
from dataclasses import replace
from pathlib import Path

from intune.agent.network import EnsembleQNetwork
from intune.agent.policy import load_weights, save_weights

HERE = Path(__file__).parent
SEEDS = (0, 1, 2, 3)


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp")
    loaded = [load_weights(HERE / f"seed{s}.pt") for s in SEEDS]
    config = replace(loaded[0][1], ensemble_members=len(SEEDS),
                     extra={**loaded[0][1].extra, "command": f"ensemble.py: hold-spell seeds {SEEDS}"})
    print("wrote", save_weights(out / "ens0123.pt", EnsembleQNetwork([q for q, _ in loaded]), config))


if __name__ == "__main__":
    main()
