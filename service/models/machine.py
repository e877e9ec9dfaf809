"""A machine class: the hardware and driver a series is measured on."""

from __future__ import annotations

from typing import Any

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base, JSONType
from service.models.base import TimestampMixin


class Machine(TimestampMixin, Base):
    """One environment fingerprint (CPU model, GPU, driver, threads); series never cross it."""

    __tablename__ = "machines"

    id: Mapped[int] = mapped_column(primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64), unique=True)
    device_class: Mapped[str] = mapped_column(String(32))
    cpu_model: Mapped[str | None] = mapped_column(String(255))
    gpu_name: Mapped[str | None] = mapped_column(String(255))
    driver: Mapped[str | None] = mapped_column(String(64))
    hostname: Mapped[str | None] = mapped_column(String(255))
    details: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
