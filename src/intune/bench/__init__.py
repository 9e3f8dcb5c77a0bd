"""Benchmark harness used by the CLI: one module per ``intune bench`` command.

The top of the layering: benchmarks import anything, nothing outside ``intune.bench`` and
``intune.cli`` imports them (``tests/test_layering.py``). The result schema they write is
``intune.results``; ``child`` runs one configuration in a fresh process; ``tune_workload`` and
``machine_control`` are the live workload and the CPU/memory restrictions of ``intune bench tune``.
"""
