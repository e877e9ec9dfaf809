"""A pull request's A/Bs over the API: ``GET /api/ab/{id}`` and ``GET /api/ab?pr=N``."""
