"""nightbench workers: the Celery app and tasks, measurement, environments, bisection, filing.

Imports ``service``; runs ``suite`` only as a subprocess (``python -m suite run``).
"""
