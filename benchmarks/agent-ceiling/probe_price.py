"""What the mask's price of new workers costs and buys, for the owner's decision on the mask: every
masked policy run twice, with the mask as shipped and with no worker priced above its stage's probe
(`SafetyLayer.probe_bytes`: 512 MB for a process worker, 64 MB for a thread worker; as shipped, only a
lone +1 is priced at most at the probe, and a stage whose workers never moved is priced at the larger of
its probe and the memory outside buffers per worker, base included).

Measured: `intune`, `steer` and the reachable teacher (as `ceiling.py`) on `intune bench agent`'s 80
held-out specs at 60-tick phases (ratio, first phase, phases 2-5), and `intune` and `steer` on its
1,000 tight-memory episodes of 120 ticks (OOM ticks, episodes with an OOM), each as `intune bench
agent` runs them. The capped price is patched in for this script only; the shipped mask is unchanged.

    python benchmarks/agent-ceiling/probe_price.py > benchmarks/agent-ceiling/probe_price.txt
"""

from __future__ import annotations

import sys
from multiprocessing import Pool
from pathlib import Path

import numpy as np

from intune.bench.agent import OOM_CHUNK, oom_cases, run_oom_chunk
from intune.policies.safety import SafetyLayer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ceiling  # noqa: E402  (this directory's scoring and specs)

SHIPPED_PRICE = SafetyLayer.stage_worker_bytes
POLICIES = ("intune", "steer", "teacher-reachable")
OOM_POLICIES = ("intune", "steer")
OOM_EPISODES, OOM_TICKS = 1000, 120


def capped_price(self: SafetyLayer, obs, refined: bool = True) -> np.ndarray:
    """``stage_worker_bytes``, no worker knob priced above its stage's probe."""
    price = SHIPPED_PRICE(self, obs, refined)
    return np.where(self._is_cpu, np.minimum(price, self.probe_bytes(obs)), price)


def set_price(capped: bool) -> None:
    SafetyLayer.stage_worker_bytes = capped_price if capped else SHIPPED_PRICE


def held_out(task: tuple) -> tuple[bool, str, dict]:
    spec, name, capped = task
    set_price(capped)
    return capped, name, ceiling.run_one((spec, "held-out", name, 60))


def tight(task: tuple) -> tuple[bool, str, tuple[int, int]]:
    name, cases, capped = task
    set_price(capped)
    result, error = run_oom_chunk((name, cases, OOM_TICKS))
    if error:
        raise RuntimeError(error)
    return capped, name, result


def main() -> None:
    specs = ceiling.held_out_specs()
    cases = oom_cases(OOM_EPISODES, OOM_TICKS)
    chunks = [cases[i : i + OOM_CHUNK] for i in range(0, len(cases), OOM_CHUNK)]
    with Pool(2) as pool:
        runs = pool.map(held_out, [(s, p, c) for s in specs for p in POLICIES for c in (False, True)], chunksize=2)
        ooms = pool.map(tight, [(p, chunk, c) for p in OOM_POLICIES for chunk in chunks for c in (False, True)])
    print("80 held-out specs, 60-tick phases; 1,000 tight-memory episodes of 120 ticks")
    for name in POLICIES:
        for capped in (False, True):
            rows = [r for c, p, r in runs if p == name and c == capped]
            line = (f"  {name:17} {'probe-capped' if capped else 'as shipped  '}: held out "
                    f"{np.mean([r['optimum_ratio'] for r in rows]):.3f} (worst {min(r['optimum_ratio'] for r in rows):.3f}); "
                    f"first phase {np.mean([r['phase_ratios'][0] for r in rows]):.3f}, "
                    f"phases 2-5 {np.mean([np.mean(r['phase_ratios'][1:]) for r in rows]):.3f}; "
                    f"OOM ticks {sum(r['ooms'] for r in rows)}")
            if name in OOM_POLICIES:
                parts = [r for c, p, r in ooms if p == name and c == capped]
                line += (f"; tight memory: {sum(r[0] for r in parts)} OOM ticks, "
                         f"{sum(r[1] for r in parts)} of {OOM_EPISODES} episodes with an OOM")
            print(line)


if __name__ == "__main__":
    main()
