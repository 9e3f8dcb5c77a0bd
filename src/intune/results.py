"""The one JSON schema of results files, the machine description, table printing, figure saving.

Every command that writes results (each ``intune bench ...``, ``intune pretrain``, ``intune calibrate``)
writes ``{"machine": {...}, "results": [...]}`` through ``write_json``, so the schema lives in one place
below the benchmarks. It must not run benchmarks, train or simulate.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def machine_info() -> dict[str, Any]:
    """CPUs this process may use (affinity and cgroup quota), memory limit, host, versions."""
    info: dict[str, Any] = {
        "host_cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        from intune import monitor

        info["usable_cpus"] = monitor.available_cpus()
        used, limit = monitor.memory_usage()
        info["memory_limit_bytes"] = limit
    except Exception:  # the monitor is optional for describing the machine
        info["usable_cpus"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        import numpy

        info["numpy"] = numpy.__version__
    except ImportError:
        pass
    return info


def write_json(path: str | os.PathLike[str], results: Sequence[Mapping[str, Any]], **extra: Any) -> Path:
    """Write ``{"machine": machine_info(), "results": results, **extra}`` to ``path`` (``dumps_results``)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"machine": machine_info(), "results": [dict(r) for r in results], **extra}
    out.write_text(dumps_results(payload))
    return out


def dumps_results(payload: Mapping[str, Any]) -> str:
    """A results file's text: one top-level key a line and one result a line, each compact.

    Why not ``indent``: a benchmark's rows are many and alike (``intune bench agent`` writes about 3,000),
    and indenting each field of each row made the committed files 1.6 times larger; a row a line still
    diffs one row at a time. The Markdown report beside a file is the one meant for reading. Floats keep
    ``SIGNIFICANT_DIGITS``: a measurement's spread is never below 0.1%, and the seventeen digits of a
    double made a third of each row."""

    def dump(value: Any) -> str:
        return json.dumps(_rounded(value), separators=(",", ":"), default=_jsonable)

    parts = []
    for key, value in payload.items():
        if key == "results" and isinstance(value, Sequence) and value:
            parts.append(f"{dump(key)}:[\n" + ",\n".join(dump(dict(row)) for row in value) + "\n]")
        else:
            parts.append(f"{dump(key)}:{dump(value)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


SIGNIFICANT_DIGITS = 6


def _rounded(value: Any) -> Any:
    """``value`` with every float (numpy's too) kept to ``SIGNIFICANT_DIGITS``; other values unchanged."""
    if isinstance(value, float) or (hasattr(value, "dtype") and getattr(value, "ndim", 1) == 0 and value.dtype.kind == "f"):
        x = float(value)
        return x if not math.isfinite(x) else float(f"{x:.{SIGNIFICANT_DIGITS}g}")
    if isinstance(value, Mapping):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    if hasattr(value, "tolist") and hasattr(value, "dtype"):
        return _rounded(value.tolist())
    return value


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def save_figure(fig: Any, path: str | os.PathLike[str], dpi: int = 110) -> Path:
    """Lay out ``fig``, write it to ``path`` (creating the folder) and release it; return the path.

    A PNG is written with a 256-colour palette: line plots use a few dozen colours, so the palette
    loses nothing visible and the committed figures take a third of the bytes of 32-bit ones.
    """
    import io

    import matplotlib.pyplot as plt
    from PIL import Image

    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() == ".png":
        buf = io.BytesIO()
        fig.savefig(buf, dpi=dpi, format="png")
        image = Image.open(buf).convert("RGB")
        palette = image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        palette.save(out, format="PNG", optimize=True)
    else:
        fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A plain-text table (markdown pipe style, so it pastes into the README)."""
    if not rows:
        return "(no results)"
    columns = list(columns or rows[0].keys())
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths, strict=True)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(columns), sep, *(line(r) for r in cells)])


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return str(value)
