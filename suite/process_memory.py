"""This process's memory, as the harness reads it: RSS, peak RSS, page faults, the leak check.

Every figure is this process's own (``/proc/self``, ``getrusage(RUSAGE_SELF)``), never a
machine-wide one. Memory is in bytes.
"""

from __future__ import annotations

import os
import resource
import statistics
from collections.abc import Sequence

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# Growth over the timed iterations above which a leak is suspected. RSS moves in allocator-sized
# steps (glibc arenas, torch's CPU allocator), so the CPU threshold sits well above that slack;
# the CUDA caching allocator's ``memory_allocated`` is exact, so a smaller one suffices.
LEAK_MIN_BYTES = 8 * 1024 * 1024
LEAK_MIN_BYTES_CUDA = 1024 * 1024
# Fewer timed iterations than this say nothing about a trend: the allocator may still be settling.
LEAK_MIN_ITERATIONS = 12


class RssReader:
    """Reads this process's RSS from an open ``/proc/self/statm`` (no open() per reading)."""

    def __init__(self) -> None:
        self._fd = os.open("/proc/self/statm", os.O_RDONLY)

    def __call__(self) -> int:
        """The RSS now, in bytes."""
        return int(os.pread(self._fd, 128, 0).split()[1]) * PAGE_SIZE

    def close(self) -> None:
        """Close the file."""
        os.close(self._fd)


def peak_rss() -> int:
    """This process's peak resident set size in bytes since the last reset (``VmHWM``).

    Raises:
        OSError: ``/proc/self/status`` has no ``VmHWM`` line (not Linux).
    """
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("VmHWM not found in /proc/self/status")


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter to the current RSS (Linux ≥ 4.0). False if refused."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def page_faults_since(before: resource.struct_rusage, steps: int) -> dict[str, float | int]:
    """This process's page faults since ``before`` (``getrusage(RUSAGE_SELF)``, all threads).

    Returns:
        ``{"minor_per_step": float, "major": int}``: minor faults (a page mapped without a disk
        read, e.g. one the allocator gave back and touched again) per step over ``steps``
        steps, and major faults (a page read from disk) in all.
    """
    now = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "minor_per_step": round((now.ru_minflt - before.ru_minflt) / max(steps, 1), 1),
        "major": now.ru_majflt - before.ru_majflt,
    }


def leak_check(baseline: int, readings: Sequence[int], threshold: int) -> dict[str, object]:
    """Judge memory readings taken after each timed iteration for a leak.

    A steady-state benchmark allocates nothing that outlives an iteration, so its memory stays
    level once warmed up, give or take what is allocated at the moment of reading. A leak keeps
    growing. The readings are cut into quarters Q1..Q4; a leak is suspected when

    - the lowest reading of Q4 exceeds the highest of Q1 by more than ``threshold`` bytes (a
      sustained rise, not a fluctuation: RSS swings by megabytes as large buffers come and go),
    - and memory rose in both halves: median(Q2) - median(Q1) and median(Q4) - median(Q3) each
      exceed ``threshold / 8`` (a one-off step, such as an allocator arena mapped once, lands in
      one half only),

    over at least :data:`LEAK_MIN_ITERATIONS` iterations.

    Args:
        baseline: memory (bytes) after warm-up.
        readings: memory (bytes) after each timed iteration, in order.
        threshold: sustained growth (bytes) above which a leak is suspected.

    Returns:
        ``growth_bytes`` (last reading - baseline), ``sustained_growth_bytes`` (min Q4 - max Q1),
        ``per_iteration_bytes`` (least-squares slope), ``iterations``, ``threshold_bytes`` and
        ``suspected``.
    """
    n = len(readings)
    verdict: dict[str, object] = {
        "growth_bytes": int(readings[-1] - baseline) if n else 0,
        "sustained_growth_bytes": 0,
        "per_iteration_bytes": 0.0,
        "iterations": n,
        "threshold_bytes": threshold,
        "suspected": False,
    }
    if n < 4:
        return verdict
    xs = range(n)
    x_mean = (n - 1) / 2
    y_mean = sum(readings) / n
    sxx = sum((x - x_mean) ** 2 for x in xs)
    verdict["per_iteration_bytes"] = float(
        sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, readings, strict=True)) / sxx
    )
    q = [readings[i * n // 4 : (i + 1) * n // 4] for i in range(4)]
    sustained = min(q[3]) - max(q[0])
    early = statistics.median(q[1]) - statistics.median(q[0])
    late = statistics.median(q[3]) - statistics.median(q[2])
    verdict["sustained_growth_bytes"] = int(sustained)
    verdict["suspected"] = bool(
        n >= LEAK_MIN_ITERATIONS
        and sustained > threshold
        and early > threshold / 8
        and late > threshold / 8
    )
    return verdict
