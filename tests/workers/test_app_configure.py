"""Configuring the Celery app again points every publisher at the new broker."""

from __future__ import annotations

from celery import Celery

from service.config import Settings
from workers.app import configure


def test_a_reconfigured_app_publishes_to_the_new_broker() -> None:
    app = Celery("reconfigured", set_as_current=False)
    first = Settings(broker_url="redis://127.0.0.1:6379/0", count_instructions=False)
    configure(app, first)
    with app.producer_or_acquire() as producer:  # the producer pool is made and cached here
        assert producer.connection.port == 6379
    configure(app, Settings(broker_url="redis://127.0.0.1:6390/0", count_instructions=False))
    # No message is sent: acquiring a producer only builds its (lazy) connection.
    with app.producer_or_acquire() as producer:
        assert producer.connection.port == 6390
