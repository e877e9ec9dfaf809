"""Alembic migrations: one dated revision per schema change."""
