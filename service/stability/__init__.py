"""Stability verdicts of benchmarks (storage of ``nightbench suite stability``)."""
