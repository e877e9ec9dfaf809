"""nightbench service: settings, the store (SQLAlchemy models), pure detection and the REST API.

Never imports ``workers``, ``suite`` or torch (see the import-linter contracts in pyproject.toml).
"""
