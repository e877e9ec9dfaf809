"""The measurement setup of a benchmark process: memory allocator, glibc tunables, threads, cores.

Process-to-process latency noise on CPU comes mostly from inside each process: where the
allocator places memory, when it returns pages to the kernel and takes them back, how the heap
is laid out. The setup fixes those choices before the process starts, so that every
``python -m suite run`` of a benchmark starts the same way:

- **allocator**: jemalloc, else tcmalloc, preloaded with ``LD_PRELOAD`` (what PyTorch's own CPU
  launcher does, ``torch/backends/xeon/run_cpu.py``, ``_Launcher.set_memory_allocator`` and
  ``add_lib_preload``). Their size-class arenas keep a tensor's memory layout the same from one
  process to the next. The libraries are searched where ``run_cpu`` searches (``$CONDA_PREFIX/lib``,
  ``$VIRTUAL_ENV/lib``, ``~/.local/lib``, ``/usr/local/lib``, ``/usr/local/lib64``, ``/usr/lib``,
  ``/usr/lib64``) plus the Debian/Ubuntu multiarch directories, under the versioned names the
  distributions install (``libjemalloc.so.2``, ``libtcmalloc.so.4``) as well as the bare ones.
  ``NIGHTBENCH_SUITE_ALLOCATOR=auto|jemalloc|tcmalloc|glibc`` forces a choice.
- **glibc fallback**: without either library, glibc's malloc with ``GLIBC_TUNABLES`` setting
  ``glibc.malloc.mmap_threshold`` and ``glibc.malloc.trim_threshold``. glibc adjusts both
  thresholds at run time from the blocks a process frees (the "dynamic mmap threshold"), so the
  same allocation may be an ``mmap`` in one process and a heap block in the next; setting either
  one turns the adjustment off (glibc manual, "Memory Allocation Tunables" and ``mallopt``'s
  ``M_MMAP_THRESHOLD``: "the dynamic adjustment ... is disabled if any of M_TRIM_THRESHOLD,
  M_TOP_PAD, M_MMAP_THRESHOLD, or M_MMAP_MAX is set"). The values are the ceiling the dynamic
  threshold can reach on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``, 32 MiB) and twice that for
  trimming, the ratio glibc itself keeps.
- **jemalloc keeps the pages it frees**: ``MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1``.
  With its defaults jemalloc 5.x puts every allocation of 8 MiB or more
  (``opt.oversize_threshold``) in a dedicated arena that hands the pages back to the kernel as
  soon as they are freed ("Purge eagerly for huge allocations", ``arena_choose_huge`` in
  jemalloc's ``src/arena.c``), so a step whose temporaries are that large maps, faults and
  zeroes them again every step: ``pyhpc_equation_of_state`` eval took 26,650 minor page faults
  a step and spent about three quarters of its time there, and how long the kernel takes for
  that moves from process to process. Without decay the pages freed stay with the process
  and are reused by the next step; a benchmark process lives for seconds, so nothing is lost
  by keeping them. ``run_cpu``'s own ``MALLOC_CONF`` (``oversize_threshold:1,
  background_thread:true,metadata_thp:auto``) keeps them too, by purging from a background
  thread, which here would run at times of its own on the benchmark's (often single, pinned)
  core. Measured in docs/benchmarks.md ("Page faults in the timed steps"). A ``MALLOC_CONF``
  already set is kept instead, and recorded.
- **threads**: ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` set to ``--threads`` (as ``run_cpu``
  sets ``OMP_NUM_THREADS`` to the cores of an instance), so the OpenMP pool is created at that
  size instead of being resized by ``torch.set_num_threads``.
- **cores**: with ``--cpus`` the process is bound before it re-executes itself (``run_cpu``
  binds with ``numactl -C`` or ``taskset``), so the allocator's and OpenMP's first threads
  already start on those cores.

A preload only takes effect in a process that starts with it, so ``python -m suite run``
re-executes itself once with the setup's environment (:func:`reexec_if_needed`); the marker
variable ``NIGHTBENCH_SUITE_SETUP_APPLIED`` keeps it from doing so twice. ``--no-setup`` or
``NIGHTBENCH_SUITE_SETUP=off`` measures without it. What is in force is read back inside the
process (:func:`setup_in_force`: the allocator mapped in ``/proc/self/maps``, the variables the
process started with, transparent huge pages, ASLR) and stored in each record's environment.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ALLOCATOR_ENV = "NIGHTBENCH_SUITE_ALLOCATOR"
SETUP_ENV = "NIGHTBENCH_SUITE_SETUP"
MARKER_ENV = "NIGHTBENCH_SUITE_SETUP_APPLIED"
ALLOCATORS = ("auto", "jemalloc", "tcmalloc", "glibc")
# DEFAULT_MMAP_THRESHOLD_MAX on 64-bit (4 * 1024 * 1024 * sizeof(long)), and twice it for trimming.
GLIBC_TUNABLES_VALUE = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=67108864"
# jemalloc never purges freed pages: no page faults on memory the last step freed.
JEMALLOC_CONF_VALUE = "dirty_decay_ms:-1,muzzy_decay_ms:-1"
_LIBRARY_NAMES = {
    "jemalloc": ("libjemalloc.so", "libjemalloc.so.2"),
    "tcmalloc": ("libtcmalloc.so", "libtcmalloc.so.4", "libtcmalloc_minimal.so.4"),
}
_THP = "/sys/kernel/mm/transparent_hugepage/enabled"
_ASLR = "/proc/sys/kernel/randomize_va_space"


class SetupUnavailable(RuntimeError):
    """A forced allocator is not installed, or ``NIGHTBENCH_SUITE_ALLOCATOR`` is not a choice."""


@dataclass(frozen=True)
class MeasurementSetup:
    """What a benchmark process should start with.

    Attributes:
        allocator: ``jemalloc``, ``tcmalloc`` or ``glibc``.
        allocator_path: the preloaded library (None for glibc).
        env: the variables to set in the process's environment.
        cpus: CPU ids to bind the process to before it starts (None: as inherited).
    """

    allocator: str
    allocator_path: str | None
    env: dict[str, str] = field(default_factory=dict)
    cpus: tuple[int, ...] | None = None


def library_dirs(environ: Mapping[str, str] | None = None) -> list[str]:
    """Where allocator libraries are looked for, in order (``run_cpu``'s list plus multiarch).

    Args:
        environ: the environment read for ``CONDA_PREFIX`` and ``VIRTUAL_ENV`` (default: this
            process's).

    Returns:
        Directory paths, existing or not, without duplicates.
    """
    environ = os.environ if environ is None else environ
    dirs = [f"{environ[v]}/lib" for v in ("CONDA_PREFIX", "VIRTUAL_ENV") if environ.get(v)]
    dirs.append(str(Path("~/.local/lib").expanduser()))
    multiarch = sysconfig.get_config_var("MULTIARCH")
    for root in ("/usr/local/lib", "/usr/local/lib64", "/usr/lib", "/usr/lib64", "/lib"):
        if multiarch and not root.endswith("64"):
            dirs.append(f"{root}/{multiarch}")
        dirs.append(root)
    return list(dict.fromkeys(dirs))


def find_allocator(name: str, dirs: Sequence[str] | None = None) -> str | None:
    """The path of allocator library ``name`` (``jemalloc`` or ``tcmalloc``), or None.

    Args:
        name: ``jemalloc`` or ``tcmalloc``.
        dirs: directories to search, in order (default: :func:`library_dirs`).

    Returns:
        The first existing file among the library's names in ``dirs``; None when none exists.
    """
    for directory in library_dirs() if dirs is None else dirs:
        for lib in _LIBRARY_NAMES[name]:
            path = os.path.join(directory, lib)
            if os.path.isfile(path):
                return path
    return None


def plan_setup(
    *,
    allocator: str = "auto",
    threads: int | None = 1,
    cpus: Sequence[int] | None = None,
    environ: Mapping[str, str] | None = None,
    dirs: Sequence[str] | None = None,
) -> MeasurementSetup:
    """Decide the setup of a benchmark process.

    Args:
        allocator: ``auto`` (jemalloc, else tcmalloc, else glibc), or one of them forced.
        threads: the benchmark's ``--threads`` (None or 0: leave the thread variables alone).
        cpus: the benchmark's ``--cpus`` (None: no binding).
        environ: the environment the process would start with (default: this process's);
            an ``LD_PRELOAD``, ``GLIBC_TUNABLES`` or ``MALLOC_CONF`` in it is kept (jemalloc
            gets :data:`JEMALLOC_CONF_VALUE` only where no ``MALLOC_CONF`` is set).
        dirs: where to look for the libraries (default: :func:`library_dirs`).

    Returns:
        The setup; its ``env`` holds only the variables it sets.

    Raises:
        SetupUnavailable: ``allocator`` is not one of :data:`ALLOCATORS`, or a forced
            ``jemalloc`` / ``tcmalloc`` is not installed.
    """
    environ = os.environ if environ is None else environ
    if allocator not in ALLOCATORS:
        raise SetupUnavailable(
            f"{ALLOCATOR_ENV}={allocator!r}: expected one of {', '.join(ALLOCATORS)}"
        )
    chosen, path = "glibc", None
    for name in ("jemalloc", "tcmalloc"):
        if allocator in ("auto", name):
            path = find_allocator(name, dirs)
            if path is not None:
                chosen = name
                break
            if allocator == name:
                raise SetupUnavailable(
                    f"{ALLOCATOR_ENV}={name}: no {'/'.join(_LIBRARY_NAMES[name])} in "
                    f"{', '.join(library_dirs() if dirs is None else dirs)}"
                )
    env: dict[str, str] = {}
    if path is not None:
        env["LD_PRELOAD"] = ":".join(filter(None, [path, environ.get("LD_PRELOAD", "")]))
        if chosen == "jemalloc" and not environ.get("MALLOC_CONF"):
            env["MALLOC_CONF"] = JEMALLOC_CONF_VALUE
    else:
        env["GLIBC_TUNABLES"] = ":".join(
            filter(None, [environ.get("GLIBC_TUNABLES", ""), GLIBC_TUNABLES_VALUE])
        )
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    env[MARKER_ENV] = chosen
    return MeasurementSetup(chosen, path, env, tuple(cpus) if cpus else None)


def setup_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """False when ``NIGHTBENCH_SUITE_SETUP`` is ``off`` (or ``0``, ``false``, ``no``)."""
    environ = os.environ if environ is None else environ
    return environ.get(SETUP_ENV, "on").strip().lower() not in ("off", "0", "false", "no")


def reexec_if_needed(
    *, threads: int | None, cpus: Sequence[int] | None, enabled: bool = True
) -> None:
    """Re-execute this process once with the setup's environment, unless it is already in force.

    Does nothing when the setup is disabled (``enabled`` False or ``NIGHTBENCH_SUITE_SETUP=off``)
    or when the marker variable says this process is already the re-executed one. Otherwise it
    binds the process to ``cpus`` (when given) and replaces it (``os.execve``, same pid, so a
    parent's timeout and process group still hold) with the same interpreter, flags and
    arguments (``sys.orig_argv``). Should the re-execution itself fail, a line on stderr says
    so and the process goes on as launched (its record then says ``"setup": "off"``).

    Args:
        threads: the benchmark's ``--threads``.
        cpus: the benchmark's ``--cpus``.
        enabled: False for ``--no-setup``.

    Raises:
        SetupUnavailable: a forced allocator is not installed (see :func:`plan_setup`).
    """
    if not enabled or not setup_enabled() or os.environ.get(MARKER_ENV):
        return
    setup = plan_setup(
        allocator=os.environ.get(ALLOCATOR_ENV, "auto").strip().lower() or "auto",
        threads=threads,
        cpus=cpus,
    )
    if setup.cpus is not None and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, setup.cpus)
        except (OSError, ValueError):
            pass  # CPUs outside the affinity: the harness reports it in the record
    argv = list(getattr(sys, "orig_argv", []) or [sys.executable, "-m", "suite", *sys.argv[1:]])
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, argv, {**os.environ, **setup.env})
    except OSError as exc:  # measure as launched; the record's setup says "off"
        print(
            f"measurement setup not applied: cannot re-execute {sys.executable}: {exc}",
            file=sys.stderr,
        )


def _mapped_allocator() -> tuple[str, str | None]:
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                parts = line.split(None, 5)
                path = parts[5].strip() if len(parts) == 6 else ""
                for name, libs in _LIBRARY_NAMES.items():
                    if any(os.path.basename(path).startswith(lib) for lib in libs):
                        return name, path
    except OSError:
        return "unknown", None
    return "glibc", None


def _bracketed(path: str) -> str | None:
    """The selected word of a sysfs choice (``always [madvise] never`` -> ``madvise``)."""
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    if "[" in text and "]" in text:
        return text[text.index("[") + 1 : text.index("]")]
    return text or None


def setup_in_force() -> dict[str, Any]:
    """The measurement setup this process really runs with, read from inside it.

    Returns:
        A JSON-ready dict: ``setup`` (``on`` when this process was started by
        :func:`reexec_if_needed`, else ``off``), ``requested`` (the allocator it asked for, None
        when off), ``allocator`` (``jemalloc`` / ``tcmalloc`` when that library is mapped in
        ``/proc/self/maps``, else ``glibc``; ``unknown`` where the maps cannot be read),
        ``allocator_path`` (the mapped file), ``glibc_tunables`` and ``malloc_conf`` (as the
        process started with them), ``omp_num_threads``, ``mkl_num_threads``, ``thp``
        (the selected mode of ``/sys/kernel/mm/transparent_hugepage/enabled``) and ``aslr``
        (``/proc/sys/kernel/randomize_va_space``, 0-2).
    """
    requested = os.environ.get(MARKER_ENV) or None
    allocator, path = _mapped_allocator()
    aslr = _bracketed(_ASLR)
    return {
        "setup": "on" if requested else "off",
        "requested": requested,
        "allocator": allocator,
        "allocator_path": path,
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
        "malloc_conf": os.environ.get("MALLOC_CONF"),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "mkl_num_threads": os.environ.get("MKL_NUM_THREADS"),
        "thp": _bracketed(_THP),
        "aslr": int(aslr) if aslr is not None and aslr.isdigit() else None,
    }


def setup_label(environment: Mapping[str, Any]) -> str:
    """A short name of a record environment's setup: ``jemalloc``, ``glibc+tunables``, ...

    Args:
        environment: a record's ``environment``.

    Returns:
        The verified allocator, ``+tunables`` when glibc runs with ``GLIBC_TUNABLES``; for
        jemalloc `` defaults`` when it ran without ``MALLOC_CONF`` (records from before the
        setup set :data:`JEMALLOC_CONF_VALUE`) and ``+MALLOC_CONF`` with another one than that;
        `` (off)`` when the setup was disabled; ``-`` for a record without ``measurement_setup``.
    """
    setup = environment.get("measurement_setup")
    if not isinstance(setup, Mapping):
        return "-"
    label = str(setup.get("allocator") or "?")
    if label == "glibc" and setup.get("glibc_tunables"):
        label += "+tunables"
    if label == "jemalloc" and setup.get("malloc_conf") != JEMALLOC_CONF_VALUE:
        label += "+MALLOC_CONF" if setup.get("malloc_conf") else " defaults"
    return label + (" (off)" if setup.get("setup") == "off" else "")
