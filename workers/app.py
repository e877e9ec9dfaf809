"""The Celery app: broker, queues, routing and reliability settings.

Without ``NIGHTBENCH_BROKER_URL`` tasks run in-process (``task_always_eager``), which is the
embedded default; with a Redis broker the same tasks run on worker processes. Job state lives in
the database, not in Celery: tasks take ids, ``acks_late`` with ``reject_on_worker_lost`` gets a
task redelivered when its worker dies, and idempotent writes make a second delivery harmless
(Celery's "Database transactions" guide; treeherder's task pattern).
"""

from __future__ import annotations

import math

from celery import Celery
from celery.schedules import crontab
from kombu import Queue

from service.config import Settings, get_settings
from service.queues import GPU_CLASSES, QUEUE_NAMES

__all__ = ["GPU_CLASSES", "app", "configure", "queue_for", "transport_options"]


def queue_for(device: str, device_class: str | None = None) -> str:
    """The queue a benchmark goes to: ``cpu`` or ``gpu.<class>``."""
    if device == "cpu":
        return "cpu"
    return f"gpu.{device_class or 'default'}"


def _crontab(expr: str) -> crontab:
    """A five-field crontab expression (minute hour day-of-month month day-of-week).

    Raises:
        ValueError: not five fields, or a field Celery rejects.
    """
    fields = expr.split()
    if len(fields) != 5:
        raise ValueError(f"NIGHTBENCH_SCHEDULE_CRON must have 5 fields, got {expr!r}")
    minute, hour, day_of_month, month_of_year, day_of_week = fields
    return crontab(
        minute=minute,
        hour=hour,
        day_of_month=day_of_month,
        month_of_year=month_of_year,
        day_of_week=day_of_week,
    )


def configure(app: Celery, settings: Settings) -> Celery:
    """(Re)configure ``app`` for ``settings``: in-process without a broker, else the broker."""
    queues = [Queue(name) for name in QUEUE_NAMES]
    app.conf.update(
        task_queues=queues,
        task_default_queue="control",
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_soft_time_limit=settings.task_soft_time_limit_s,
        task_time_limit=settings.task_time_limit_s,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        timezone="UTC",
        beat_schedule={
            "sweep-deadlines": {
                "task": "night.sweep_deadlines",
                "schedule": 300.0,
                "options": {"queue": "control"},
            },
            "retry-filing": {
                "task": "issues.retry_filing",
                "schedule": 300.0,
                "options": {"queue": "control"},
            },
            "sync-issues": {
                "task": "issues.sync",
                "schedule": 600.0,
                "options": {"queue": "control"},
            },
        },
    )
    if settings.schedule_cron:
        app.conf.beat_schedule["dispatch-night"] = {
            "task": "night.dispatch",
            "schedule": _crontab(settings.schedule_cron),
            "options": {"queue": "control"},
        }
    if settings.embedded:
        app.conf.update(
            broker_url="memory://",
            task_always_eager=True,
            task_eager_propagates=True,
            broker_transport_options={},
            result_backend=None,
        )
    else:
        app.conf.update(
            broker_url=settings.broker_url,
            broker_transport_options=transport_options(settings),
            result_backend=settings.result_backend,
            task_always_eager=False,
        )
    # Drop the pools made under the previous broker: Celery's close() forgets the connection
    # pool, but the producer pool its AMQP helper cached keeps publishing to the old broker
    # (Celery 5.7), so that is forgotten too.
    app.close()
    amqp = app.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None
    return app


def transport_options(settings: Settings) -> dict[str, object]:
    """The Redis transport options kombu gets for ``settings``: visibility timeout, key prefix and,
    where ``broker_restore_every_s`` is set, how often a worker restores unacknowledged tasks.

    Source: kombu's Redis transport options (``kombu/transport/redis.py``).
    """
    options: dict[str, object] = {"visibility_timeout": settings.visibility_timeout_s}
    if settings.queue_prefix:
        options["global_keyprefix"] = settings.queue_prefix
    if settings.broker_restore_every_s is not None:
        # kombu scans on every `throttle`-th tick of `interval` s; one scan per tick here.
        options["unacked_restore_interval"] = settings.broker_restore_every_s
        options["unacked_restore_throttle"] = 1
        # A worker killed mid-scan leaves the scan's lock held until it expires (kombu: 300 s);
        # with scans this frequent that is likelier, so the lock lasts ten periods.
        options["unacked_mutex_expire"] = max(1, math.ceil(10 * settings.broker_restore_every_s))
    return options


app = configure(Celery("nightbench", include=["workers.tasks"]), get_settings())
