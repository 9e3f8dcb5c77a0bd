"""Fresh-process runs of one benchmark configuration, for the benchmarks that need a clean process.

Owns ``run_child``: the spec goes to a child ``python -m MODULE SPEC.json OUT.json`` and its JSON result
comes back, a failure as ``{"error": ...}``. It must not interpret results (each benchmark does).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def run_child(module: str, spec: Mapping[str, Any], timeout_s: float, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """One benchmark run in a fresh process (``python -m MODULE SPEC.json OUT.json``): its JSON result,
    or ``{"error": ...}`` (exit status and the last lines of its output, or the timeout) instead of
    raising, so that one failed run does not end a benchmark of many."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix=f"{module.rsplit('.', 1)[-1]}-") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        cmd = [sys.executable, "-m", module, str(spec_path), str(out_path)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env={**os.environ, **(env or {})})
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout_s:.0f} s"}
        if proc.returncode != 0 or not out_path.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return {"error": f"exit {proc.returncode}: {' | '.join(tail)}"}
        return json.loads(out_path.read_text())
