"""The broker as the status sees it: messages waiting in each Celery queue, and which workers
listen to the queues that hold some.

A message in a queue no worker consumes waits for ever, silently: a GPU class whose runners are
down leaves the night's jobs and any bisection's probes there, and only a deadline (a day for a
bisection) would tell. So when a queue holds messages, the status asks the workers which queues
they consume (Celery's remote control, ``inspect().active_queues()``, the call behind ``celery
inspect active_queues``) and names each queue that holds messages and that none of them
consumes. A queue that holds nothing costs no broadcast.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from service.errors import InfrastructureError
from service.queues import QUEUE_NAMES

LISTEN_TIMEOUT_S = 2.0  # how long the status waits for the workers' answers


@dataclass(frozen=True)
class BrokerState:
    """What the status reports of the broker.

    Attributes:
        queues: messages waiting per Celery queue; None without a broker (or unreadable).
        listeners: per queue, the workers (node names) consuming it; None when no queue held
            messages (nobody was asked) or there is no broker.
        problems: one line per thing to look at: a broker that cannot be read, a queue holding
            messages that no worker consumes.
    """

    queues: dict[str, int] | None = None
    listeners: dict[str, list[str]] | None = None
    problems: list[str] = field(default_factory=list)


def _redis(broker_url: str | None) -> bool:
    return bool(broker_url) and str(broker_url).startswith(("redis://", "rediss://"))


def queue_lengths(broker_url: str | None, *, prefix: str = "") -> dict[str, int] | None:
    """Messages waiting in each Celery queue (Redis ``LLEN`` of its list), or None.

    Args:
        broker_url: the broker (``NIGHTBENCH_BROKER_URL``); None (in-process tasks) or a broker
            other than Redis gives None.
        prefix: the key prefix of the broker's keys (``NIGHTBENCH_QUEUE_PREFIX``).

    Raises:
        InfrastructureError: the broker could not be read.
    """
    if not _redis(broker_url):
        return None
    import redis

    try:
        client = redis.Redis.from_url(str(broker_url), socket_timeout=5, socket_connect_timeout=5)
        with client.pipeline(transaction=False) as pipe:
            for name in QUEUE_NAMES:
                pipe.llen(f"{prefix}{name}")
            counts = pipe.execute()
    except redis.RedisError as exc:
        raise InfrastructureError(f"could not read the queues from the broker: {exc}") from exc
    return {name: int(n) for name, n in zip(QUEUE_NAMES, counts, strict=True)}


def queue_listeners(
    broker_url: str | None, *, prefix: str = "", timeout_s: float = LISTEN_TIMEOUT_S
) -> dict[str, list[str]] | None:
    """The workers consuming each Celery queue, by asking them (a remote-control broadcast).

    Args:
        broker_url: the broker; None or a broker other than Redis gives None.
        prefix: the key prefix the workers use (``NIGHTBENCH_QUEUE_PREFIX``): only workers
            under the same prefix hear the broadcast.
        timeout_s: seconds to wait for answers (s); a worker that answers later counts as absent.

    Returns:
        Every name of ``QUEUE_NAMES`` mapped to the sorted node names of the workers that
        answered consuming it (an empty list: none did). Queues no nightbench queue name covers
        are left out.

    Raises:
        InfrastructureError: the broker could not be reached.
    """
    if not _redis(broker_url):
        return None
    from celery import Celery
    from kombu.exceptions import OperationalError

    app = Celery("nightbench-status", broker=broker_url, set_as_current=False)
    if prefix:
        app.conf.broker_transport_options = {"global_keyprefix": prefix}
    try:
        answers = app.control.inspect(timeout=timeout_s).active_queues() or {}
    except (OperationalError, OSError) as exc:
        raise InfrastructureError(f"could not ask the workers through the broker: {exc}") from exc
    finally:
        app.close()
    out: dict[str, list[str]] = {name: [] for name in QUEUE_NAMES}
    for worker, queues in answers.items():
        for queue in queues or []:
            if queue.get("name") in out:
                out[queue["name"]].append(worker)
    return {name: sorted(workers) for name, workers in out.items()}


def broker_state(
    broker_url: str | None,
    *,
    prefix: str = "",
    waiting_on: dict[str, list[str]] | None = None,
    timeout_s: float = LISTEN_TIMEOUT_S,
) -> BrokerState:
    """The queue lengths and, when a queue holds messages, its listeners and the problems.

    Args:
        broker_url: the broker (None: in-process tasks, nothing to report).
        prefix: its key prefix.
        waiting_on: per queue, what the database says waits there (``"bisection 7's
            probes"``, ``"2 job(s) of run 12"``), named in the queue's problem line.
        timeout_s: seconds the workers get to answer (:func:`queue_listeners`).

    A broker that cannot be read is a problem line, never an exception: the status is what a
    person reads when things are wrong.
    """
    try:
        queues = queue_lengths(broker_url, prefix=prefix)
    except InfrastructureError as exc:
        return BrokerState(problems=[exc.message])
    if not queues or not any(queues.values()):
        return BrokerState(queues=queues)
    try:
        listeners = queue_listeners(broker_url, prefix=prefix, timeout_s=timeout_s) or {}
    except InfrastructureError as exc:
        return BrokerState(queues=queues, problems=[exc.message])
    problems = []
    for name, waiting in queues.items():
        if waiting and not listeners.get(name):
            what = "; ".join((waiting_on or {}).get(name, [])) or "the tasks sent to it"
            problems.append(
                f"queue `{name}` holds {waiting} message(s) and no worker listens to it (none "
                f"answered within {timeout_s:g} s): {what} wait there until one does "
                f"(nightbench worker --queue {name})"
            )
    return BrokerState(queues=queues, listeners=listeners, problems=problems)
