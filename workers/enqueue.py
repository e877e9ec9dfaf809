"""What happens next, by name: a domain function returns :class:`Step` values, a task sends them.

A night is a chain of named tasks (``bench.run`` → ``night.finish`` → the confirmation run's
``bench.run`` → ``night.finish`` → ``night.triage`` → ``bisect.advance`` / ``bisect.probe`` →
``night.file``). No domain module calls another room's task: it returns the steps, and the task
that ran it (or the command that started the chain) hands them to :func:`send`. Each step is
one task, one session scope.

With a broker, :func:`send` publishes each step by its task name (``Celery.send_task``), so the
sender imports no task module. In the embedded default (no broker: ``task_always_eager``) the
steps run in this thread, one after the other, in the order they were sent: the first
:func:`send` on a thread runs a loop (a trampoline) and every :func:`send` made by the steps it
runs only appends to that loop's queue. A night's chain therefore runs as a loop, not as a
recursion of tasks inside tasks, and an exception in a step ends the loop and propagates to the
caller, as an eager task's would (``task_eager_propagates``).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from workers.app import app

CONTROL = "control"


@dataclass(frozen=True)
class Step:
    """One task to run next.

    Attributes:
        task: the task's registered name, e.g. ``"night.finish"``.
        args: its positional arguments (ids: tasks take ids, never rows).
        queue: the queue it goes to (``control`` for orchestration; ``cpu`` / ``gpu.<class>``
            for measuring).
    """

    task: str
    args: tuple[Any, ...] = ()
    queue: str = CONTROL


Observer = Callable[[Step, bool], None]
"""Told of each step an embedded chain runs: ``(step, done)``."""

_local = threading.local()


def send(steps: Iterable[Step], *, observer: Observer | None = None) -> None:
    """Enqueue ``steps`` in order: to the broker by name, or, embedded, run them on this thread.

    Args:
        steps: the steps to send.
        observer: embedded, called as ``observer(step, False)`` before and ``observer(step,
            True)`` after each step the loop started here runs, the chain's later steps
            included (a progress bar); not called with a broker, or when a loop below on this
            thread runs the steps.

    Raises:
        KeyError: embedded, a step names no registered task.
        Exception: embedded, whatever a step's task raised (the remaining steps are dropped).
    """
    steps = list(steps)
    if not app.conf.task_always_eager:
        for step in steps:
            app.send_task(step.task, args=list(step.args), queue=step.queue)
        return
    pending: deque[Step] | None = getattr(_local, "pending", None)
    if pending is not None:  # a loop below us on this thread runs them
        pending.extend(steps)
        return
    app.loader.import_default_modules()  # registers the tasks of ``include``
    _local.pending = pending = deque(steps)
    try:
        while pending:
            step = pending.popleft()
            if observer is not None:
                observer(step, False)
            app.tasks[step.task].apply(args=step.args, throw=True)
            if observer is not None:
                observer(step, True)
    finally:
        _local.pending = None
