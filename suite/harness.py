"""The measuring harness: warm-up, timed iterations, raw samples, peak memory of this process.

Method (after pyperf and TorchBench's ``torchbenchmark/util/experiment/metrics.py``):

- pin the thread count (1 by default on CPU) and optionally the CPU affinity, so that the
  scheduler's choices and a shared machine's other work move the figures as little as possible;
- build the model and inputs, then record the resident set size ("ready" RSS) and reset the
  kernel's peak-RSS counter (``/proc/self/clear_refs`` with ``5``), so that ``cpu_peak_mem`` is
  the peak *above* the library's own footprint (a torch wheel's ~220-510 MB, which would otherwise
  turn a change of wheel into a false memory regression); ``cpu_peak_mem_total`` keeps the whole
  peak. Both are this process's own figures (``VmHWM``), never machine-wide ones, read after
  a fixed number of steps (the minimum warm-up and timed iterations together,
  :class:`PeakAfterSteps`), not after however many the host's speed let run, so that a model
  whose memory grows every step reads the same peak on a quiet night and a busy one;
- with ``NIGHTBENCH_SUITE_DEVICE_LOCK`` set, hold an exclusive lock on that file from here to
  the end of the timed iterations (:mod:`suite.device_lock`: processes prepare at once and
  measure one at a time);
- warm up until both a minimum iteration count and a minimum time are reached (first-call
  allocations, autotuning and ``torch.compile`` happen there); on CUDA then until the time is
  steady (clocks settled), with ``cudnn.benchmark`` off (:mod:`suite.gpu_setup`);
- time each iteration on its own, with the garbage collector off: ``time.perf_counter`` on CPU;
  CUDA events recorded around the iteration on CUDA, with a device synchronisation every ten
  iterations and at the end. On CPU the process's CPU time per iteration (``cpu_time``) is kept
  beside the wall-clock latency: a step that waited for a core (another job on a shared machine)
  shows in ``latency`` but not in ``cpu_time``, which tells contention from a slower build;
- on CUDA, ``torch.cuda.reset_peak_memory_stats`` before warm-up and
  ``torch.cuda.max_memory_allocated`` after the same fixed number of steps (this process's
  allocator);
- a leak check: memory after each timed iteration (RSS on CPU, ``memory_allocated`` on CUDA),
  read outside the timed region, against memory after warm-up;
- the page faults of the timed iterations (``getrusage``), kept beside the warm-up in
  ``environment["page_faults"]``: minor faults per step show an allocator handing memory back
  to the kernel and faulting it in again every step; major ones, pages read from disk.

Latency samples are in ms per iteration; memory in bytes.
"""

from __future__ import annotations

import gc
import os
import resource
import statistics
import sysconfig
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from suite import gpu_setup
from suite.device_lock import device_lock
from suite.environment import collect_environment
from suite.foreign_code import foreign_owner
from suite.process_memory import (
    LEAK_MIN_BYTES,
    LEAK_MIN_BYTES_CUDA,
    RssReader,
    leak_check,
    page_faults_since,
    peak_rss,
    reset_peak_rss,
)
from suite.records import UNITS, BenchmarkRecord, MetricRecord
from suite.registry import benchmark_version, load_model_class, model_domain

INJECT_ENV = "NIGHTBENCH_SUITE_INJECT_WORK"
_MODELS_ROOT = str(Path(__file__).resolve().parent / "models")
# Where installed libraries live: a failure's location is reported outside them (the model's code).
_LIBRARY_ROOTS = tuple(
    {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    | {str(Path(torch.__file__).resolve().parent.parent)}
)


@dataclass(frozen=True)
class HarnessConfig:
    """How much to measure.

    Attributes:
        warmup_iterations: minimum warm-up iterations.
        warmup_seconds: minimum warm-up wall time (s).
        min_iterations: minimum timed iterations (samples).
        max_iterations: maximum timed iterations.
        min_seconds: timed iterations continue until this much wall time (s) has passed.
        threads: ``torch.set_num_threads`` for CPU benchmarks (None: leave torch's default).
        inject_work: extra work per iteration as a fraction of its model step (0 = none);
            a calibration knob to check that the detector catches a known slowdown.
        cpus: CPU ids to pin this process to (``os.sched_setaffinity``); None leaves the
            affinity as inherited.
        steady_warmup: after the minimums, warm up until the iteration time is steady
            (:func:`suite.gpu_setup.is_steady`); None: on for CUDA, off on CPU.
        warmup_max_iterations: the steady warm-up's cap in iterations.
        warmup_max_seconds: the steady warm-up's cap in wall time (s).
    """

    warmup_iterations: int = 3
    warmup_seconds: float = 0.5
    min_iterations: int = 15
    max_iterations: int = 200
    min_seconds: float = 2.0
    threads: int | None = 1
    inject_work: float = 0.0
    cpus: tuple[int, ...] | None = None
    steady_warmup: bool | None = None
    warmup_max_iterations: int = 200
    warmup_max_seconds: float = 60.0


def median_iqr(samples: Sequence[float]) -> tuple[float | None, float | None]:
    """Median and interquartile range (Q3 − Q1, ``statistics.quantiles`` 'inclusive')."""
    if not samples:
        return None, None
    if len(samples) == 1:
        return float(samples[0]), 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return float(statistics.median(samples)), float(q3 - q1)


def _prepare_injection(fraction: float) -> Callable[[float], None]:
    """Set up injected work costing ``fraction`` of each iteration.

    The matmul's operand is allocated and the operator run once here, before the "ready" RSS
    is read, so that whatever the first ``torch.mm`` allocates (thread pools, workspaces)
    counts as footprint, not as peak memory, and each product is written into one buffer
    allocated here, so that the work allocates nothing between the model's own allocations
    (with an allocator that keeps freed pages, interleaved allocations move the model's peak:
    resnet18 eval +11.5 MiB): injected work changes latency only. The work is
    real (small matmuls on the CPU) and runs until ``fraction * step_ms`` of wall-clock time
    has passed, where ``step_ms`` is the model step it follows. Each timed iteration is then
    ``(1 + fraction)`` times its own model step, so the planted step is the dose asked for in
    every process, whatever that process's level (a dose fixed from the warm-up median fell
    short by half when the timed loop ran slower than the warm-up, and a dose counted in
    matmuls fell short by a third when the matmuls ran cold).

    Returns:
        ``work(step_ms)``: does the extra work for a model step of ``step_ms`` milliseconds;
        does nothing when ``fraction`` is 0 (the set-up runs all the same, so that a process
        with a dose and one without start their timed steps from the same memory).
    """
    a, out = torch.randn(96, 96), torch.empty(96, 96)
    for _ in range(10):  # with or without a dose: the same "ready" state in every process
        torch.mm(a, a, out=out)
    if fraction <= 0:
        return lambda step_ms: None
    clock = time.perf_counter

    def work(step_ms: float) -> None:  # into ``out``: no allocation between the model's own
        end = clock() + fraction * step_ms / 1e3
        torch.mm(a, a, out=out)
        while clock() < end:
            torch.mm(a, a, out=out)

    return work


def _inject_fraction(model: str, mode: str, default: float) -> float:
    """``NIGHTBENCH_SUITE_INJECT_WORK="resnet18:train=0.2,bert=0.05"``; ``model`` = all modes."""
    spec = os.environ.get(INJECT_ENV, "")
    for item in filter(None, (s.strip() for s in spec.split(","))):
        key, _, value = item.partition("=")
        if key in (model, f"{model}:{mode}"):
            return float(value)
    return default


def injection(model: str, mode: str, default: float = 0.0) -> Callable[[float], None]:
    """The injected work of ``model`` in ``mode``, set up as a timed run sets it up.

    The dose is ``NIGHTBENCH_SUITE_INJECT_WORK``'s for the benchmark, else ``default`` (a
    fraction of a step); see :func:`_prepare_injection` for what the work is and how it is
    dosed. Other measurements (``suite/profiling.py``) plant the same work this way.

    Returns:
        ``work(step_ms)``: the extra work after a model step of ``step_ms`` milliseconds.
    """
    return _prepare_injection(_inject_fraction(model, mode, default))


def _is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    oom_cls = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_cls is not None and isinstance(exc, oom_cls):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(
        phrase in text
        for phrase in (
            "out of memory",
            "not enough memory",
            "can't allocate memory",
            "cannot allocate memory",
        )
    )


def describe_failure(exc: BaseException) -> str:
    """The error text of a failed benchmark: ``"Type: message (at file:line in function)"``.

    An out-of-memory of any kind (``MemoryError``, torch's CPU allocator refusing, CUDA OOM) is
    named ``OutOfMemoryError`` so that it reads the same on every device. The location is the
    innermost frame outside the installed libraries and the harness (normally the model's own
    code), else the innermost frame. A location in another suite's code (a TorchBench
    checkout, :func:`suite.foreign_code.register_foreign_code`) says whose code it is:
    ``"Type: message (in TorchBench's code at torchbenchmark/models/x/__init__.py:50 in train)"``.
    """
    name = "OutOfMemoryError" if _is_out_of_memory(exc) else type(exc).__name__
    message = (str(exc).strip().splitlines() or [""])[0][:2000]
    frames = traceback.extract_tb(exc.__traceback__)
    own = [
        f
        for f in frames
        if f.filename.startswith(_MODELS_ROOT)
        or (not f.filename.startswith(_LIBRARY_ROOTS) and f.filename != __file__)
    ]
    frame = (own or frames)[-1] if (own or frames) else None
    where = ""
    foreign = foreign_owner(frame.filename) if frame is not None else None
    if frame is not None and foreign is not None:
        owner, path = foreign
        where = f" (in {owner}'s code at {path}:{frame.lineno} in {frame.name})"
    elif frame is not None:
        where = f" (at {os.path.basename(os.path.dirname(frame.filename))}/"
        where += f"{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name})"
    return f"{name}: {message}{where}" if message else f"{name}{where}"


def _pin(cfg: HarnessConfig, device: str) -> None:
    if device == "cpu" and cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.cpus is not None:
        if not hasattr(os, "sched_setaffinity"):
            raise NotImplementedError("CPU pinning needs os.sched_setaffinity (Linux)")
        available = os.sched_getaffinity(0)
        wanted = set(cfg.cpus)
        if not wanted or not wanted <= available:
            raise ValueError(f"cpus {sorted(wanted)} not within this process's {sorted(available)}")
        os.sched_setaffinity(0, wanted)


def run_benchmark(
    model: str,
    mode: str,
    device: str = "cpu",
    *,
    compiler: str = "eager",
    batch_size: int | None = None,
    config: HarnessConfig | None = None,
) -> BenchmarkRecord:
    """Build one suite model and measure it.

    Args:
        model: suite model name (``python -m suite list``), or ``torchbench.<name>``.
        mode: ``"train"`` or ``"eval"``.
        device: ``"cpu"`` or ``"cuda"``.
        compiler: ``"eager"`` or ``"inductor"``.
        batch_size: overrides the metadata's batch size.
        config: sample counts and knobs; defaults to :class:`HarnessConfig`.

    Returns:
        A record with metrics ``latency`` (ms), ``cpu_time`` (ms, CPU only), ``cpu_peak_mem`` and
        ``cpu_peak_mem_total`` (bytes), ``gpu_peak_mem`` (bytes, CUDA only), ``mem_growth`` (bytes), the leak verdict
        and the environment. A failure (an exception in the model, ``NotImplementedError`` for an
        unsupported configuration, an out-of-memory) is returned as a record whose ``error``
        holds the reason (see :func:`describe_failure`); nothing is raised.
    """
    cfg = config or HarnessConfig()
    record = BenchmarkRecord(model=model, mode=mode, device=device, compiler=compiler)
    try:
        _pin(cfg, device)
        if device == "cuda":
            gpu_setup.apply_gpu_setup()
        record.benchmark_version = benchmark_version(model)
        record.environment = collect_environment(device)
        cls = load_model_class(model)
        bench = cls(test=mode, device=device, batch_size=batch_size)
        bench.set_compiler(compiler)
        record.batch_size = bench.batch_size
        if device == "cuda":  # its code may have turned cudnn.benchmark on
            gpu_setup.apply_gpu_setup()
        # Re-read after the model is built: its code may have changed a precision switch.
        record.environment = collect_environment(device)
        # What the model is, for the service's catalogue (not part of the machine fingerprint).
        record.environment["model_domain"] = model_domain(model)
        step = bench.train if mode == "train" else bench.eval
        inject = _inject_fraction(model, mode, cfg.inject_work)
        if inject:  # planted work is part of what was measured: the record says so
            record.environment["injected_work"] = inject
        with device_lock() as waited:  # one warm-up and timing at a time, when asked
            if waited is not None:
                record.environment["device_lock"] = {"waited_s": round(waited, 3)}
            _measure(step=step, device=device, cfg=cfg, record=record, inject=inject)
    except Exception as exc:  # noqa: BLE001 - every failure becomes an error record, by design
        record.error = describe_failure(exc)
        record.metrics = []
        record.leak = None
    finally:
        if device == "cuda" and torch.cuda.is_available():
            torch.cuda.empty_cache()
    return record


class PeakAfterSteps:
    """A peak-memory reading taken once, after a fixed number of steps since the "ready" point
    (warm-up and timed steps counted together), whatever the number of steps run in all.

    The warm-up and the timed loop run for a minimum time as well as a minimum count, so how
    many steps a process runs depends on how fast the host is that evening. A benchmark whose
    memory grows a little every step (sac eval under torch 2.13: about 0.35 MiB a step with
    jemalloc, 0.55 MiB with glibc) would then read a higher peak on a quiet night than on a
    busy one: measured, 32.9 MiB at 51 steps, 60.7 MiB at 123 and 99.8 MiB at 225, the same
    build; and five `make nightly` nights of one build filed a +30% peak-memory regression.
    Read after the same number of steps in every process, the peak is the same work's peak
    (the minimum warm-up and timed iterations together, 18 by default: every process runs
    at least that many; docs/benchmarks.md, "Peak memory after a fixed number of steps").

    Args:
        steps: the step after which to read (1 or more).
        read: returns the peak(s) then (bytes).
    """

    def __init__(self, steps: int, read: Callable[[], tuple[int, int]]) -> None:
        if steps < 1:
            raise ValueError(f"steps must be at least 1, got {steps}")
        self.steps = steps
        self._read = read
        self._seen = 0
        self.value: tuple[int, int] | None = None

    def after_step(self) -> None:
        """Count one step; read the peak after the :attr:`steps`-th."""
        self._seen += 1
        if self._seen == self.steps:
            self.value = self._read()

    def result(self) -> tuple[int, int]:
        """The reading, or one taken now when fewer than :attr:`steps` steps ran."""
        return self.value if self.value is not None else self._read()


def _measure(
    *,
    step: Callable[[], object],
    device: str,
    cfg: HarnessConfig,
    record: BenchmarkRecord,
    inject: float,
) -> None:
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rss = RssReader()
    try:
        inject_work = _prepare_injection(inject)
        gc.collect()
        ready_rss = rss()
        reset_ok = reset_peak_rss()
        if cuda:
            sync()
            torch.cuda.reset_peak_memory_stats()
        # The peaks after a fixed number of steps, the fewest any process runs (the minimums).
        peaks = PeakAfterSteps(
            cfg.warmup_iterations + cfg.min_iterations,
            lambda: (
                peak_rss() if reset_ok else rss(),
                torch.cuda.max_memory_allocated() if cuda else 0,
            ),
        )
        steady = cfg.steady_warmup if cfg.steady_warmup is not None else cuda
        warm_ms, reached = _warm_up(step, sync, cfg, steady=steady, after_step=peaks.after_step)
        record.environment["warmup"] = {
            "iterations": len(warm_ms),
            "steady": reached,
            "sm_clock_mhz": gpu_setup.sm_clock_mhz() if cuda else None,
        }
        warm_median = statistics.median(warm_ms[len(warm_ms) // 2 :])
        extra: Callable[[float], None] = inject_work
        if cuda:  # the host cannot see a step's GPU time: dose from the warm-up median
            extra = lambda _step_ms: inject_work(warm_median)  # noqa: E731
        gc.collect()
        memory = torch.cuda.memory_allocated if cuda else rss
        after_warmup = memory()
        readings: list[int] = []
        cpu_times: list[float] = []
        faults = resource.getrusage(resource.RUSAGE_SELF)
        samples = _timed_loop(
            step, extra, cfg, cuda, sync, memory, readings, cpu_times, after_step=peaks.after_step
        )
        record.environment["page_faults"] = page_faults_since(faults, len(samples))
        peak_total, gpu_peak = peaks.result()
        if not reset_ok:  # no kernel peak counter: RSS then is the best lower bound
            peak_total = max(ready_rss, peak_total)
        record.environment["peak_memory_steps"] = peaks.steps
    finally:
        rss.close()

    metrics: list[MetricRecord] = []

    def add(metric: str, values: list[float]) -> None:
        med, iqr = median_iqr(values)
        metrics.append(
            MetricRecord(metric=metric, unit=UNITS[metric], samples=values, median=med, iqr=iqr)
        )

    add("latency", samples)
    if not cuda:
        add("cpu_time", cpu_times)
    add("cpu_peak_mem", [float(max(peak_total - ready_rss, 0))])
    add("cpu_peak_mem_total", [float(peak_total)])
    if cuda:
        add("gpu_peak_mem", [float(gpu_peak)])
    leak = leak_check(after_warmup, readings, LEAK_MIN_BYTES_CUDA if cuda else LEAK_MIN_BYTES)
    add("mem_growth", [float(leak["growth_bytes"])])  # type: ignore[arg-type]
    record.leak = leak
    record.metrics = metrics


def _warm_up(
    step: Callable[[], object],
    sync: Callable[[], None],
    cfg: HarnessConfig,
    *,
    steady: bool = False,
    after_step: Callable[[], None] = lambda: None,
) -> tuple[list[float], bool | None]:
    """Run the warm-up steps; return each step's latency (ms) and whether it became steady.

    Stops when both minimums (``cfg.warmup_iterations``, ``cfg.warmup_seconds``) are met, or
    after ten times the minimum iterations. With ``steady`` it then goes on until the
    iteration time is steady (:func:`suite.gpu_setup.is_steady`), at most
    ``cfg.warmup_max_iterations`` iterations or ``cfg.warmup_max_seconds`` in all.

    ``after_step`` is called after each step (outside its time).

    Returns ``(times, reached)``: ``reached`` is None without ``steady``, else whether the time
    became steady before a cap.
    """
    warm_ms: list[float] = []
    start = time.perf_counter()
    while len(warm_ms) < cfg.warmup_iterations or time.perf_counter() - start < cfg.warmup_seconds:
        warm_ms.append(_timed_step(step, sync))
        after_step()
        if len(warm_ms) >= 10 * max(cfg.warmup_iterations, 1):
            break
    if not steady:
        return warm_ms, None
    while not gpu_setup.is_steady(warm_ms):
        if (
            len(warm_ms) >= cfg.warmup_max_iterations
            or time.perf_counter() - start >= cfg.warmup_max_seconds
        ):
            return warm_ms, False
        warm_ms.append(_timed_step(step, sync))
        after_step()
    return warm_ms, True


def _timed_step(step: Callable[[], object], sync: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    step()
    sync()
    return (time.perf_counter() - t0) * 1e3


def _timed_loop(
    step: Callable[[], object],
    extra: Callable[[float], None],
    cfg: HarnessConfig,
    cuda: bool,
    sync: Callable[[], None],
    memory: Callable[[], int],
    readings: list[int],
    cpu_times: list[float] | None = None,
    *,
    after_step: Callable[[], None] = lambda: None,
) -> list[float]:
    """Run the timed iterations; return their latencies (ms).

    Also fills ``readings`` (memory after each iteration, bytes) and, on CPU, ``cpu_times``
    (this process's CPU time per iteration, ms; read just outside the wall-clock window, so
    the latency samples do not include the extra clock reads); ``after_step`` is called after
    each iteration, outside its time.
    """
    perf_counter = time.perf_counter
    process_time = time.process_time
    cpu_ms = cpu_times if cpu_times is not None else []
    gc_was_enabled = gc.isenabled()
    gc.disable()  # collections inside the timed region add noise unrelated to the model
    try:
        start = perf_counter()
        if cuda:
            events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
            while len(events) < cfg.min_iterations or (
                perf_counter() - start < cfg.min_seconds and len(events) < cfg.max_iterations
            ):
                begin = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                begin.record()
                step()
                extra(0.0)
                end.record()
                events.append((begin, end))
                readings.append(memory())
                after_step()
                if len(events) % 10 == 0:
                    sync()  # bounds the queue so wall-time checks mean something
            sync()
            return [b.elapsed_time(e) for b, e in events]
        samples: list[float] = []
        while len(samples) < cfg.min_iterations or (
            perf_counter() - start < cfg.min_seconds and len(samples) < cfg.max_iterations
        ):
            c0 = process_time()
            t0 = perf_counter()
            step()
            extra((perf_counter() - t0) * 1e3)
            t1 = perf_counter()
            c1 = process_time()
            samples.append((t1 - t0) * 1e3)
            cpu_ms.append((c1 - c0) * 1e3)
            readings.append(memory())
            after_step()
        return samples
    finally:
        if gc_was_enabled:
            gc.enable()
