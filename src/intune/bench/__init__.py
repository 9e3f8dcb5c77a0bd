"""Benchmark harness used by the CLI: one module per ``intune bench`` command, shared result schema."""
