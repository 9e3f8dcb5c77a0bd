"""Build ensembles (mean Q-values, ``EnsembleQNetwork``) of the headroom-teacher seeds: ``ens01.pt``
(seeds 0 and 1), ``ens012.pt`` (seeds 0-2) and ``ens0123.pt`` (all four), written to the directory given (default /tmp).

Run: ``python benchmarks/candidate-holds/headroom-teacher/ensemble.py [DIR]``.
"""

import sys
from dataclasses import replace
from pathlib import Path

from intune.agent.network import EnsembleQNetwork
from intune.agent.policy import load_weights, save_weights

HERE = Path(__file__).parent


def write_ensemble(path: Path, members: Path, seeds: tuple[int, ...], label: str) -> Path:
    """The ensemble of ``members/seed{S}.pt`` for ``seeds``, saved at ``path`` with the first member's
    config; ``label`` names the members in the stored command."""
    loaded = [load_weights(members / f"seed{s}.pt") for s in seeds]
    config = replace(loaded[0][1], ensemble_members=len(seeds),
                     extra={**loaded[0][1].extra, "command": f"ensemble.py: {label} seeds {seeds}"})
    return save_weights(path, EnsembleQNetwork([q for q, _ in loaded]), config)


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp")
    for name, seeds in (("ens01", (0, 1)), ("ens012", (0, 1, 2)), ("ens0123", (0, 1, 2, 3))):
        print("wrote", write_ensemble(out / f"{name}.pt", HERE, seeds, "headroom"))


if __name__ == "__main__":
    main()
