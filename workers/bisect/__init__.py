"""Bisection: pure search, verdicts, measuring probes, local and Celery drivers."""
