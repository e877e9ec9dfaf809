"""One measurement at a time on a shared device: an exclusive lock around warm-up and timing.

Starting a benchmark process costs far more than measuring it on a GPU (start, ``import torch``
with CUDA, the CUDA context, building the model: some 10 s against 3 s of warm-up and timed
iterations on an H200). With ``NIGHTBENCH_SUITE_DEVICE_LOCK`` set to a file path, the harness
holds an exclusive ``flock(2)`` on that file from the end of the model's build until its timed
iterations end, so several processes can prepare at once while only one warms up and measures.
The other processes' preparation (their CUDA contexts, weight copies, input generation) still
runs beside the timed one, so figures measured this way can only be noisier than one process
at a time: a benchmark found steady under the lock is steady; one found unsteady wants a
measurement without it. Measurement tools use it (``benchmarks/measurement_setup.py
--overlap``); the nightly measures one process at a time and does not set it.

The time spent waiting is kept per process in ``environment["device_lock"]`` (not part of the
machine fingerprint).
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

DEVICE_LOCK_ENV = "NIGHTBENCH_SUITE_DEVICE_LOCK"


@contextmanager
def device_lock(path: str | None = None) -> Iterator[float | None]:
    """Hold the exclusive lock on ``path`` (default: ``$NIGHTBENCH_SUITE_DEVICE_LOCK``) for the
    ``with`` block; without a path, do nothing.

    Yields:
        the seconds waited for the lock, or None when no lock was asked for.

    Raises:
        OSError: the lock file cannot be opened or created (a missing directory, no permission).
    """
    path = path if path is not None else os.environ.get(DEVICE_LOCK_ENV) or None
    if path is None:
        yield None
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise OSError(
            exc.errno, f"cannot open the device lock {path!r} ({DEVICE_LOCK_ENV}): {exc.strerror}"
        ) from exc
    try:
        start = time.monotonic()
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield time.monotonic() - start
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
