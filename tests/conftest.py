"""Shared pytest configuration."""

import os

# Keep numeric libraries from oversubscribing the 2-core CI machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
