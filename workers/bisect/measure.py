"""Measuring a probe: suite benchmarks or benchmark commands, in a build's environment.

Two measurers take latency samples (ms) of one benchmark in one
:class:`~workers.builds.base.BuildEnvironment`:

- :class:`SuiteMeasurer`: ``MODEL:MODE:DEVICE`` benchmarks of the suite, measured by running
  ``python -m suite run --model M --mode MODE --device D --out FILE`` with the probe's
  interpreter and ``PYTHONPATH``; the samples come from the record's ``metrics[...]`` entry with
  ``"metric": "latency"``.
- :class:`CommandMeasurer`: any shell command, run in the probe's checkout as working
  directory, that prints ``{"samples": [ms, ...]}`` on its last line of stdout. It is told how
  many samples are wanted through ``NIGHTBENCH_SAMPLES``.

Both spread a probe's samples over several processes, as pyperf does: a process's speed
depends on its memory layout and on what else ran when it started, so samples from one process
understate the spread between two processes of the same build, and a verdict would call two
runs of one commit ``different``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from service.benchmarks import benchmark_name
from service.errors import InvalidInput, MeasureError
from workers.builds.base import BuildEnvironment
from workers.runner import run_suite

REPO_ROOT = Path(__file__).resolve().parents[2]
"""Where ``suite/`` lives; put on ``PYTHONPATH`` so ``python -m suite`` runs in any environment."""

SAMPLES_ENV = "NIGHTBENCH_SAMPLES"
DEFAULT_MEASURE_TIMEOUT_S = 1800.0
_MODES = ("train", "eval")
_DEVICES = ("cpu", "cuda")
_COMPILERS = ("eager", "inductor")


class Measurer(Protocol):
    """Takes samples of one benchmark in one build environment."""

    processes: int
    """How many processes a probe's samples are spread over."""

    def measure(self, env: BuildEnvironment, benchmark: str, samples: int) -> tuple[float, ...]:
        """At least ``samples`` latency samples (ms), from several processes.

        Raises:
            MeasureError: the benchmark could not be measured.
        """
        ...  # pragma: no cover

    def measure_once(self, env: BuildEnvironment, benchmark: str, samples: int) -> list[float]:
        """About ``samples`` latency samples (ms) from one process.

        Raises:
            MeasureError: the benchmark could not be measured.
        """
        ...  # pragma: no cover


def quiet_env(env: BuildEnvironment) -> dict[str, str]:
    """The probe's environment for a measuring process: one thread unless set otherwise."""
    environ = env.environ()
    # One thread per process: probes share the machine, and thread counts move latency.
    environ.setdefault("OMP_NUM_THREADS", "1")
    environ.setdefault("MKL_NUM_THREADS", "1")
    return environ


def _tail(text: str, lines: int = 10) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


@dataclass(frozen=True)
class SuiteBenchmark:
    """A suite benchmark named ``MODEL:MODE:DEVICE`` (``:COMPILER`` when not eager)."""

    model: str
    mode: str
    device: str
    compiler: str = "eager"

    @property
    def name(self) -> str:
        """The benchmark's name, ``model:mode:device[:compiler]``."""
        return benchmark_name(self.model, self.mode, self.device, self.compiler)


def parse_benchmark(spec: str) -> SuiteBenchmark:
    """Parse ``MODEL:MODE:DEVICE`` or ``MODEL:MODE:DEVICE:COMPILER`` (``resnet18:eval:cpu``).

    Raises:
        InvalidInput: not three or four parts, or an unknown mode, device or compiler.
    """
    parts = spec.strip().split(":")
    if len(parts) not in (3, 4) or not all(parts):
        raise InvalidInput(
            f"benchmark {spec!r} must look like MODEL:MODE:DEVICE, e.g. resnet18:eval:cpu"
        )
    model, mode, device = parts[:3]
    compiler = parts[3] if len(parts) == 4 else "eager"
    if mode not in _MODES:
        raise InvalidInput(f"benchmark {spec!r}: mode must be one of {', '.join(_MODES)}")
    if device not in _DEVICES:
        raise InvalidInput(f"benchmark {spec!r}: device must be one of {', '.join(_DEVICES)}")
    if compiler not in _COMPILERS:
        raise InvalidInput(f"benchmark {spec!r}: compiler must be one of {', '.join(_COMPILERS)}")
    return SuiteBenchmark(model, mode, device, compiler)


class SuiteMeasurer:
    """Measures ``MODEL:MODE:DEVICE`` benchmarks with ``python -m suite run``.

    Args:
        timeout_s: seconds one suite process may take.
        threads: torch threads on CPU (``--threads``).
        warmup: minimum warm-up iterations.
        processes: suite processes a probe's samples are spread over.
    """

    def __init__(
        self,
        *,
        timeout_s: float = DEFAULT_MEASURE_TIMEOUT_S,
        threads: int = 1,
        warmup: int = 3,
        processes: int = 2,
    ) -> None:
        if processes < 1:
            raise InvalidInput(f"processes must be at least 1, got {processes}")
        self.timeout_s = timeout_s
        self.threads = threads
        self.warmup = warmup
        self.processes = processes

    def measure(self, env: BuildEnvironment, benchmark: str, samples: int) -> tuple[float, ...]:
        """Run the suite in a few processes for ``samples`` timed iterations in all (ms each).

        Raises:
            MeasureError: a process failed, timed out, or its record holds an error or no
                latency samples.
        """
        taken: list[float] = []
        runs = max(1, min(self.processes, samples))
        for run in range(runs):
            want = -(-(samples - len(taken)) // (runs - run))
            taken.extend(self.measure_once(env, benchmark, want))
        return tuple(taken)

    def measure_once(self, env: BuildEnvironment, benchmark: str, samples: int) -> list[float]:
        """``samples`` timed iterations of one suite process (ms each).

        The process is :func:`workers.runner.run_suite`'s: its own process group, killed whole
        after ``timeout_s`` seconds.

        Raises:
            MeasureError: the process failed, timed out, wrote an unreadable record, or its
                record holds an error or no latency samples.
        """
        record = self.record_once(env, benchmark, samples)
        for metric in record.get("metrics", []):
            if metric.get("metric") == "latency" and metric.get("samples"):
                return [float(v) for v in metric["samples"]]
        raise MeasureError(f"{parse_benchmark(benchmark).name}: the record has no latency samples")

    def record_once(self, env: BuildEnvironment, benchmark: str, samples: int) -> dict[str, Any]:
        """The whole record (``suite/records.py``'s shape) of one suite process timing
        ``samples`` iterations: latency, peak memory and the rest of its metrics.

        Raises:
            MeasureError: the process failed, timed out, wrote an unreadable record, or its
                record holds an error.
        """
        b = parse_benchmark(benchmark)
        environ = quiet_env(env)
        environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (environ.get("PYTHONPATH", ""), str(REPO_ROOT)) if p
        )
        args = [
            "run",
            "--model",
            b.model,
            "--mode",
            b.mode,
            "--device",
            b.device,
            "--compiler",
            b.compiler,
            "--iterations",
            str(samples),
            "--max-iterations",
            str(samples),
            "--min-seconds",
            "0",
            "--warmup",
            str(self.warmup),
            "--threads",
            str(self.threads),
        ]
        # No cwd: the runner's scratch directory, so a checkout's own package directory does not
        # shadow what the build installed.
        outcome = run_suite(env.python, args, timeout_s=self.timeout_s, env=environ)
        if outcome.timed_out:
            raise MeasureError(f"{b.name} did not finish in {self.timeout_s:.0f} s")
        if not outcome.wrote_record:
            raise MeasureError(
                f"{b.name} wrote no record (exit {outcome.returncode}): {_tail(outcome.stderr)}"
            )
        if outcome.record is None:
            raise MeasureError(f"{b.name}: {outcome.error}")
        record = outcome.record
        if record.get("error"):
            raise MeasureError(f"{b.name}: {record['error']}")
        return record


class CommandMeasurer:
    """Measures benchmarks defined by shell commands printing ``{"samples": [ms, ...]}``.

    Args:
        commands: benchmark name → shell command. The command runs in the probe's checkout with
            the probe's environment (``python`` and ``pip`` are the probe's),
            ``NIGHTBENCH_SAMPLES`` set to the samples wanted from that run, and
            ``OMP_NUM_THREADS=1`` unless set.
        timeout_s: seconds one run of a command may take.
        processes: runs a probe's samples are spread over (at most one run per sample).

    Raises:
        InvalidInput: no command, an empty one, or ``processes`` < 1.
    """

    def __init__(
        self,
        commands: Mapping[str, str],
        *,
        timeout_s: float = DEFAULT_MEASURE_TIMEOUT_S,
        processes: int = 12,
    ) -> None:
        if not commands or not all(c.strip() for c in commands.values()):
            raise InvalidInput("command: give a non-empty benchmark command")
        if processes < 1:
            raise InvalidInput(f"processes must be at least 1, got {processes}")
        self.commands = dict(commands)
        self.timeout_s = timeout_s
        self.processes = processes

    def measure(self, env: BuildEnvironment, benchmark: str, samples: int) -> tuple[float, ...]:
        """Run the command in several processes until they have printed ``samples`` samples (ms).

        Raises:
            MeasureError: the command failed, timed out, or its last line is not
                ``{"samples": [positive numbers]}``.
        """
        taken: list[float] = []
        runs = max(1, min(self.processes, samples))
        for run in range(samples + runs):
            if len(taken) >= samples:
                break
            want = -(-(samples - len(taken)) // max(runs - run, 1))
            taken.extend(self.measure_once(env, benchmark, want))
        return tuple(taken)

    def measure_once(self, env: BuildEnvironment, benchmark: str, samples: int) -> list[float]:
        """One run of the benchmark's command, asked for ``samples`` samples (ms).

        Raises:
            MeasureError: the command failed, timed out, or its last line is not
                ``{"samples": [positive numbers]}``.
        """
        command = self.commands[benchmark]
        environ = quiet_env(env)
        environ[SAMPLES_ENV] = str(samples)
        try:
            proc = subprocess.run(
                command,
                shell=True,
                capture_output=True,
                text=True,
                env=environ,
                cwd=env.workdir,
                timeout=self.timeout_s,
            )
        except subprocess.TimeoutExpired as exc:
            raise MeasureError(f"{command!r} did not finish in {self.timeout_s:.0f} s") from exc
        if proc.returncode != 0:
            raise MeasureError(
                f"{command!r} exited with status {proc.returncode}: {_tail(proc.stderr)}"
            )
        return parse_samples_line(proc.stdout, command)


def parse_samples_line(stdout: str, command: str = "command") -> list[float]:
    """The samples of a benchmark command's last stdout line, ``{"samples": [ms, ...]}``.

    Raises:
        MeasureError: no output, not JSON, no ``samples`` list, or a sample that is not a
            positive number.
    """
    lines = [line for line in stdout.strip().splitlines() if line.strip()]
    if not lines:
        raise MeasureError(
            f'{command!r} printed nothing; its last line must be {{"samples": [...]}}'
        )
    try:
        data = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise MeasureError(
            f'{command!r}: last line {lines[-1][:80]!r} is not JSON like {{"samples": [...]}}'
        ) from exc
    values = data.get("samples") if isinstance(data, dict) else None
    if not isinstance(values, list) or not values:
        raise MeasureError(f'{command!r}: last line has no non-empty "samples" list')
    try:
        out = [float(v) for v in values]
    except (TypeError, ValueError) as exc:
        raise MeasureError(f"{command!r}: samples must be numbers (ms)") from exc
    if not all(v > 0 and v == v and v != float("inf") for v in out):
        raise MeasureError(f"{command!r}: samples must be positive finite numbers (ms)")
    return out
