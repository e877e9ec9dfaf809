"""Regressions: detection (pure), triage and alerts."""
