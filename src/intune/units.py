"""Byte units, defined once: what a ``*_mb`` knob or field counts and what a ``*_gb`` one does.

``MB`` is 2**20 bytes (a mebibyte): every ``buffer_mb`` knob, a spec's ``worker_mb`` and the
policies' memory arithmetic use it. It must hold constants only.
"""

from __future__ import annotations

MB = 1 << 20
"""Bytes in one MB as the knobs count it (2**20)."""

GB = 1 << 30
"""Bytes in one GB as the simulator's specs count it (2**30)."""

__all__ = ["GB", "MB"]
