"""The benchmark suite: models following TorchBench's contract and the measuring harness.

Run as ``python -m suite``. This package imports torch (and model-building libraries such as
transformers) but never ``service`` or ``workers``: it runs inside the environment under test,
as a subprocess of a worker.
"""
