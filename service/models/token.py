"""API tokens: the credential for write endpoints, stored only as a SHA-256 hash."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base, UTCDateTime
from service.models.base import TimestampMixin


class ApiToken(TimestampMixin, Base):
    """A named token; the plain value is shown once at creation and never stored."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    # sha256 hex of the token: a leaked table does not leak usable credentials.
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
