"""The models catalogue: what each measured model is, as its records say."""

from __future__ import annotations

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base
from service.models.base import TimestampMixin


class CatalogModel(TimestampMixin, Base):
    """One model name with its domain, from the ``model_domain`` of its latest stored record.

    The service learns what a model is from what the suite reports, never from the suite's
    files: models measured elsewhere (TorchBench, posted results) are catalogued the same way.
    """

    __tablename__ = "models"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    domain: Mapped[str | None] = mapped_column(String(64))
