"""Measuring a probe by counting: instructions executed (``cpu_instructions``), not latency.

A bisection of a count regression measures each probe by callgrind's instruction count
(valgrind), which a busy host does not move: one counted process per probe is enough where
latency needs many (docs/architecture.md, "Metrics"). Two measurers, the counterparts of
:class:`~workers.bisect.measure.SuiteMeasurer` and :class:`~workers.bisect.measure.CommandMeasurer`:

- :class:`SuiteCountMeasurer`: a CPU suite benchmark ``MODEL:MODE:cpu``, counted by ``python -m
  suite count`` (``suite/counting.py``) with the probe's interpreter: one valgrind process, each
  sample one counted step (instructions per step).
- :class:`CommandCountMeasurer`: any shell command, run under ``valgrind --tool=callgrind
  --collect-atstart=no --trace-children=yes``. What is counted is what the command itself
  brackets with ``torch._C._valgrind_toggle()`` and ``torch._C._valgrind_toggle_and_dump_stats()``
  (as ``torch.utils.benchmark``'s ``collect_callgrind`` does): each dump is one sample. A command
  that toggles nothing is run again with collection on from the start, and its whole run (every
  process it started, summed) is one sample; more samples are more runs. ``NIGHTBENCH_SAMPLES``
  tells the command how many windows are wanted.

Both raise :class:`~service.errors.MeasureError` for a benchmark that cannot be counted, the
verdicts then treat the probe as they treat a failed measurement.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from service.config import get_settings
from service.errors import InvalidInput, MeasureError
from workers.bisect.measure import (
    DEFAULT_MEASURE_TIMEOUT_S,
    REPO_ROOT,
    SAMPLES_ENV,
    CommandMeasurer,
    SuiteMeasurer,
    parse_benchmark,
    quiet_env,
)
from workers.builds.base import BuildEnvironment, log_tail
from workers.runner import run_suite

VALGRIND = ("--tool=callgrind", "--dump-instr=no", "--trace-children=yes")
COUNT_SAMPLES = (6, 6)
"""Samples a counted probe takes (and its cap): counts stray by a fraction of a percent, but
the search's rank tests need six a side to reach their error rate at the first look (with
three a side the smallest one-sided Mann-Whitney p is 0.05), so no probe is measured twice."""
WHOLE_RUN_SAMPLES = 3
"""``NIGHTBENCH_SAMPLES`` of a command counted whole: always the same, so every run does the
same work (what the command does may depend on it)."""
# A profile's total, as suite/counting.py reads it (the suite runs in the build's environment,
# so workers read its files rather than import it).
_TOTALS = re.compile(r"^(?:totals|summary):\s+(\d+)", re.MULTILINE)


def _valgrind() -> str:
    path = shutil.which("valgrind")
    if path is None:
        raise MeasureError(
            "valgrind is not installed (apt-get install valgrind): cpu_instructions cannot be "
            "counted on this host"
        )
    return path


def dump_totals(directory: Path) -> tuple[list[int], int]:
    """The counts of a callgrind output directory: the numbered dumps of toggled windows, in
    order (one process's ``callgrind.<pid>.<n>``), and the sum of every process's final dump.

    Raises:
        MeasureError: a file is not a callgrind profile.
    """
    windows: list[tuple[int, int, int]] = []
    whole = 0
    for path in directory.glob("callgrind.*"):
        parts = path.name.split(".")
        match = _TOTALS.search(path.read_text(errors="replace"))
        if match is None:
            raise MeasureError(f"{path.name}: no 'totals:' line; not a callgrind profile")
        value = int(match.group(1))
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            windows.append((int(parts[1]), int(parts[2]), value))
        elif len(parts) == 2 and parts[1].isdigit():
            whole += value
    return [v for _, _, v in sorted(windows)], whole


class SuiteCountMeasurer(SuiteMeasurer):
    """Counts ``MODEL:MODE:cpu`` suite benchmarks with ``python -m suite count``; a probe's
    samples are spread over processes as :class:`SuiteMeasurer` spreads timed ones.

    Args:
        timeout_s: seconds one counting process may take.
        warmup_steps: uncounted steps before the counted ones.
        processes: counting processes a probe's samples are spread over (1: counts do not
            stray between processes the way latency does).
        batch_size: the batch size counted; None: the count series' own
            (``NIGHTBENCH_COUNT_BATCH_SIZE``, 2 by default), so that a probe counts the step
            whose count regressed; 0: each model's own batch size.
    """

    def __init__(
        self,
        *,
        timeout_s: float = DEFAULT_MEASURE_TIMEOUT_S,
        warmup_steps: int = 2,
        processes: int = 1,
        batch_size: int | None = None,
    ) -> None:
        super().__init__(timeout_s=timeout_s, warmup=warmup_steps, processes=processes)
        self.batch_size = get_settings().count_batch_size if batch_size is None else batch_size

    def measure_once(self, env: BuildEnvironment, benchmark: str, samples: int) -> list[float]:
        """``samples`` counted steps of one valgrind process (instructions per step), at
        :attr:`batch_size`.

        Raises:
            InvalidInput: the benchmark is not on the CPU.
            MeasureError: valgrind is missing, the process failed or timed out, or its record
                holds an error or no count.
        """
        b = parse_benchmark(benchmark)
        if b.device != "cpu":
            raise InvalidInput(f"{b.name}: instructions are counted on the CPU only")
        _valgrind()
        environ = quiet_env(env)
        environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (environ.get("PYTHONPATH", ""), str(REPO_ROOT)) if p
        )
        args = [
            "count",
            "--benchmarks",
            f"{b.model}:{b.mode}" + (f":{self.batch_size}" if self.batch_size else ""),
            "--warmup-steps",
            str(self.warmup),
            "--repeats",
            str(max(1, samples)),
            "--timeout",
            str(self.timeout_s),
        ]
        outcome = run_suite(env.python, args, timeout_s=self.timeout_s + 60, env=environ)
        records = (outcome.record or {}).get("records") or []
        if not records:
            raise MeasureError(
                f"{b.name}: no count ({outcome.error or 'no record'}): {log_tail(outcome.stderr)}"
            )
        record = records[0]
        if record.get("error"):
            raise MeasureError(f"{b.name}: {record['error']}")
        if record.get("skipped"):
            raise MeasureError(f"{b.name}: {next(iter(record['skipped'].values()))}")
        return [float(v) for v in record["metrics"][0]["samples"]]


class CommandCountMeasurer(CommandMeasurer):
    """Counts the instructions of benchmark commands under callgrind (module docstring).

    Args:
        commands: benchmark name → shell command, run in the probe's checkout with the probe's
            environment and ``NIGHTBENCH_SAMPLES`` set to the windows wanted.
        timeout_s: seconds one run of a command may take.
        processes: runs a probe's samples are spread over when the command brackets windows.

    Raises:
        InvalidInput: no command, an empty one, or ``processes`` < 1.
    """

    def __init__(
        self,
        commands: Mapping[str, str],
        *,
        timeout_s: float = DEFAULT_MEASURE_TIMEOUT_S,
        processes: int = 1,
    ) -> None:
        super().__init__(commands, timeout_s=timeout_s, processes=processes)
        self.whole: set[str] = set()  # benchmarks whose command toggles nothing

    def measure(self, env: BuildEnvironment, benchmark: str, samples: int) -> tuple[float, ...]:
        """At least ``samples`` counts: the command's windows, or whole runs when it toggles
        nothing.

        Raises:
            MeasureError: as :meth:`measure_once`.
        """
        taken: list[float] = []
        for _ in range(samples + self.processes):
            if len(taken) >= samples:
                break
            taken.extend(self.measure_once(env, benchmark, samples - len(taken)))
        return tuple(taken)

    def measure_once(self, env: BuildEnvironment, benchmark: str, samples: int) -> list[float]:
        """One run of the command under callgrind: its windows' counts, or (when it toggles
        nothing) one more run counted whole, as one sample.

        Raises:
            MeasureError: valgrind is missing, the command failed or timed out, or it counted
                nothing.
        """
        if benchmark not in self.whole:
            windows = self._run(env, benchmark, samples, collect_at_start=False)[0]
            if windows:
                return [float(v) for v in windows]
            self.whole.add(benchmark)  # it toggles nothing: count its runs whole from now on
        whole = self._run(env, benchmark, WHOLE_RUN_SAMPLES, collect_at_start=True)[1]
        if whole <= 0:
            raise MeasureError(f"{self.commands[benchmark]!r}: callgrind counted nothing")
        return [float(whole)]

    def _run(
        self, env: BuildEnvironment, benchmark: str, samples: int, *, collect_at_start: bool
    ) -> tuple[list[int], int]:
        command = self.commands[benchmark]
        environ = quiet_env(env)
        environ[SAMPLES_ENV] = str(samples)
        environ.setdefault("PYTHONHASHSEED", "0")
        with tempfile.TemporaryDirectory(prefix="nightbench-callgrind-") as tmp:
            argv = [
                _valgrind(),
                *VALGRIND,
                f"--collect-atstart={'yes' if collect_at_start else 'no'}",
                f"--callgrind-out-file={tmp}/callgrind.%p",
                "/bin/sh",
                "-c",
                command,
            ]
            try:
                proc = subprocess.run(
                    argv,
                    capture_output=True,
                    text=True,
                    env=environ,
                    cwd=env.workdir,
                    timeout=self.timeout_s,
                )
            except subprocess.TimeoutExpired as exc:
                raise MeasureError(
                    f"{command!r} under callgrind did not finish in {self.timeout_s:.0f} s"
                ) from exc
            if proc.returncode != 0:
                raise MeasureError(
                    f"{command!r} under callgrind exited with status {proc.returncode}: "
                    f"{log_tail(proc.stderr)}"
                )
            return dump_totals(Path(tmp))
