"""Bisection by instruction counts (``--metric cpu_instructions``): probes counted under
callgrind, which a busy host does not move."""

from __future__ import annotations

import math
import shutil
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from service.errors import InvalidInput, MeasureError
from service.metrics import INSTRUCTIONS, bisect_once
from service.models import Probe
from workers.bisect import celery_driver
from workers.bisect.counts import COUNT_SAMPLES, CommandCountMeasurer, dump_totals
from workers.bisect.local_driver import bisect_repository, run_bisection
from workers.bisect.search import (
    CULPRIT,
    ENDPOINT,
    INCONCLUSIVE,
    BisectionState,
    SearchConfig,
    outcome,
    start,
)
from workers.builds.base import BuildEnvironment
from workers.cli import app
from workers.demo.minitok import ENCODE, INSTALL_COMMAND, make_package_repository


def _profile(path: Path, ir: int) -> None:
    path.write_text(f"# callgrind format\nevents: Ir\nsummary: {ir}\n\ntotals: {ir}\n")


def test_dump_totals_orders_windows_and_sums_whole_processes(tmp_path: Path) -> None:
    _profile(tmp_path / "callgrind.200.2", 30)
    _profile(tmp_path / "callgrind.200.1", 10)
    _profile(tmp_path / "callgrind.200.10", 50)
    _profile(tmp_path / "callgrind.200", 0)  # the final dump of a process whose windows dumped
    _profile(tmp_path / "callgrind.100", 7)  # the shell that started it, counted whole
    assert dump_totals(tmp_path) == ([10, 30, 50], 7)
    (tmp_path / "callgrind.300").write_text("garbage\n")
    with pytest.raises(MeasureError, match="not a callgrind profile"):
        dump_totals(tmp_path)


def test_a_bisection_refuses_a_metric_it_cannot_measure(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="metric: must be one of latency, cpu_instructions"):
        bisect_repository(tmp_path, "a" * 40, "b" * 40, commands=["true"], metric="cpu_peak_mem")
    with pytest.raises(InvalidInput, match="non-empty"):
        CommandCountMeasurer({"x": " "})
    out = CliRunner().invoke(
        app,
        [
            "bisect",
            "--repo",
            str(tmp_path),
            "--good",
            "a",
            "--bad",
            "b",
            "--command",
            "true",
            "--metric",
            "wall",
        ],
    )
    assert out.exit_code != 0 and "--metric must be one of latency, cpu_instructions" in out.output


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_a_pure_python_slowdown_is_bisected_by_its_instruction_count(tmp_path: Path) -> None:
    # bench.py toggles nothing: each probe's whole run is counted (python's start, the
    # tokenizer's calls); the culprit adds checks to encode's loops.
    repo = make_package_repository(tmp_path / "minitok", commits=3, encode_culprit=2)
    data = bisect_repository(
        repo.path,
        repo.good,
        repo.bad,
        commands=[f"MINITOK_INNER=1 {ENCODE}"],
        install=INSTALL_COMMAND,
        work_dir=tmp_path / "builds",
        metric="cpu_instructions",
    ).as_json()
    assert data["outcome"] == "culprit", data
    (culprit,) = data["culprits"]
    assert culprit["sha"] == repo.culprits[ENCODE]
    assert culprit["change"][f"MINITOK_INNER=1 {ENCODE}"] > 0.05
    assert data["builds"] <= math.ceil(math.log2(4)) + 2
    counts = [s for p in data["probes"] for r in p["results"] for s in r["samples"]]
    assert min(counts) > 1e6  # instructions, not milliseconds


def test_a_night_bisects_by_counting_when_a_count_regressed() -> None:
    from service.config import Settings
    from service.models import Bisection, Regression
    from workers.bisect.celery_driver import bisected_by, measurer_for, night_search_config
    from workers.bisect.counts import SuiteCountMeasurer
    from workers.bisect.measure import SuiteMeasurer

    def reg(i: int, model: str, metric: str) -> Regression:
        return Regression(
            id=i, model=model, mode="eval", device="cpu", compiler="eager", metric=metric
        )

    sac_time, sac_count, bert_time = (
        reg(1, "sac", "latency"),
        reg(2, "sac", "cpu_instructions"),
        reg(3, "bert", "latency"),
    )
    # The count moved with sac's time: both bisected by counting; bert's time alone is not.
    metric, covered = bisected_by([sac_time, sac_count, bert_time])
    assert metric == "cpu_instructions" and [r.id for r in covered] == [1, 2]
    metric, covered = bisected_by([sac_time, bert_time])
    assert metric == "latency" and [r.id for r in covered] == [1, 3]
    settings = Settings()
    assert night_search_config(settings, "cpu_instructions").initial_samples == 6
    counted = Bisection(config={"measure": {"suite": True, "metric": "cpu_instructions"}})
    timed = Bisection(config={"measure": {"suite": True}})
    assert isinstance(measurer_for(counted, settings), SuiteCountMeasurer)
    assert isinstance(measurer_for(timed, settings), SuiteMeasurer)


_STAND_IN = """#!/bin/sh
# Stands in for a build's interpreter running `python -m suite count ... --out FILE`: it keeps
# its arguments and writes a record of one count.
printf '%s\\n' "$@" > "$ARGS_FILE"
while [ $# -gt 0 ]; do [ "$1" = "--out" ] && out="$2"; shift; done
printf '{"records": [{"metrics": [{"samples": [1234.0]}]}]}' > "$out"
"""


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_a_counted_probe_counts_at_the_count_series_batch_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The night's count series is counted at NIGHTBENCH_COUNT_BATCH_SIZE (2): a probe counted at
    # the model's own batch (sac eval: 8192) would dilute a Python-level regression out of sight.
    from service.config import get_settings
    from workers.bisect.counts import SuiteCountMeasurer
    from workers.builds.base import BuildEnvironment

    python = tmp_path / "python"
    python.write_text(_STAND_IN)
    python.chmod(0o755)
    env = BuildEnvironment(
        sha="a" * 40, provider="python-overlay", python=python, root=tmp_path, workdir=tmp_path
    )
    monkeypatch.setenv("ARGS_FILE", str(tmp_path / "args"))

    def benchmarks(measurer: SuiteCountMeasurer) -> str:
        assert measurer.measure_once(env, "sac:eval:cpu", 6) == [1234.0]
        args = (tmp_path / "args").read_text().splitlines()
        assert args[:3] == ["-m", "suite", "count"] and args[args.index("--repeats") + 1] == "6"
        return args[args.index("--benchmarks") + 1]

    get_settings.cache_clear()
    try:
        assert benchmarks(SuiteCountMeasurer()) == "sac:eval:2"
        assert benchmarks(SuiteCountMeasurer(batch_size=5)) == "sac:eval:5"
        monkeypatch.setenv("NIGHTBENCH_COUNT_BATCH_SIZE", "0")  # each model's own
        get_settings.cache_clear()
        assert benchmarks(SuiteCountMeasurer()) == "sac:eval"
    finally:
        get_settings.cache_clear()


# ----- each build counted once ------------------------------------------------------------------

STEP = 1_000_000.0
"""Instructions a step counts before the culprit; the culprit adds 10%."""


def _sha(index: int) -> str:
    return f"{index:040x}"


def _counts(index: int, culprit: int, samples: int) -> list[float]:
    """A build's counts: the same for every process of it (a stray of a few instructions)."""
    level = STEP * (1.1 if index >= culprit else 1.0)
    return [level + k % 3 for k in range(samples)]


class FakeCounter:
    """Stands in for a count measurer (one process per call, as ``SuiteCountMeasurer``): a step
    at ``culprit``; records every build it was asked to measure; ``broken`` builds fail as a
    valgrind error does."""

    processes = 1

    def __init__(self, culprit: int, broken: frozenset[int] = frozenset()) -> None:
        self.culprit = culprit
        self.broken = broken
        self.measured: list[str] = []

    def measure(self, env: BuildEnvironment, benchmark: str, samples: int) -> tuple[float, ...]:
        return tuple(self.measure_once(env, benchmark, samples))

    def measure_once(self, env: BuildEnvironment, benchmark: str, samples: int) -> list[float]:
        self.measured.append(env.sha)
        index = int(env.sha, 16)
        if index in self.broken:
            raise MeasureError(f"{benchmark}: valgrind exited with status 1")
        return _counts(index, self.culprit, samples)


def _bisect(
    n: int, counter: FakeCounter, metric: str, tmp_path: Path, samples: int = COUNT_SAMPLES[0]
) -> tuple[BisectionState, list[str]]:
    """Drive the local driver over ``n`` commits with ``counter``, settings as for ``metric``
    (a count bisection's samples either way, so only the metric's rule differs)."""
    config = SearchConfig(
        initial_samples=samples,
        max_samples=samples,
        slower=True,
        measure_once=bisect_once(metric),
    )

    def build(sha: str) -> BuildEnvironment:
        return BuildEnvironment(
            sha=sha, provider="checkout", python=tmp_path, root=tmp_path, workdir=tmp_path
        )

    state = start([_sha(i) for i in range(n + 1)], ["sac:eval:cpu"], config)
    return run_bisection(state, build=build, measurer=counter), counter.measured


@pytest.mark.parametrize("culprit", [1, 5, 9, 16])
def test_a_count_bisection_counts_each_build_once(culprit: int, tmp_path: Path) -> None:
    n = 16
    state, counted = _bisect(n, FakeCounter(culprit), INSTRUCTIONS, tmp_path)
    final = outcome(state)
    assert final is not None and final.kind == CULPRIT, final
    assert final.culprits[0][0] == _sha(culprit)
    # Every build counted once, the endpoints included: ⌈log2(N+1)⌉ + 2 processes at most.
    assert set(Counter(counted).values()) == {1}
    assert len(counted) == final.builds <= math.ceil(math.log2(n + 1)) + 2
    # After the first round a round counts only its new probe, and its record says whose
    # endpoint counts it was judged against: the first round's, reused.
    for probe in state.probes:
        if probe.round == 0:
            assert probe.purpose == ENDPOINT and probe.index in (0, n)
            continue
        assert 0 < probe.index < n
        (verdict,) = probe.results
        assert verdict.reference_rounds == (0,)
        assert verdict.vs_good is not None and verdict.vs_bad is not None
        assert verdict.side == ("bad" if probe.index >= culprit else "good")
    # The same counts with the endpoints counted again every round, as before: three
    # processes a round.
    before, recounted = _bisect(n, FakeCounter(culprit), "latency", tmp_path)
    assert outcome(before) is not None and outcome(before).culprits[0][0] == _sha(culprit)
    assert len(counted) < len(recounted)


class WholeRunCounter(FakeCounter):
    """A command counted whole: one sample a process (as ``CommandCountMeasurer`` counts a
    command that toggles nothing), ``measure`` running as many as asked."""

    def measure(self, env: BuildEnvironment, benchmark: str, samples: int) -> tuple[float, ...]:
        return tuple(v for _ in range(samples) for v in self.measure_once(env, benchmark, 1))

    def measure_once(self, env: BuildEnvironment, benchmark: str, samples: int) -> list[float]:
        return super().measure_once(env, benchmark, 1)


def test_a_build_counted_once_gets_every_sample_it_asked_for(tmp_path: Path) -> None:
    # Never counted again, a probe takes its samples whole in its one round, however few a
    # process gives (interleaved turns would stop at four of six).
    n, culprit = 16, 9
    state, counted = _bisect(n, WholeRunCounter(culprit), INSTRUCTIONS, tmp_path)
    final = outcome(state)
    assert final is not None and final.culprits[0][0] == _sha(culprit)
    assert all(len(p.results[0].samples) == COUNT_SAMPLES[0] for p in state.probes)
    assert len({p.sha for p in state.probes}) == len(state.probes)
    assert set(Counter(counted).values()) == {COUNT_SAMPLES[0]}


def test_a_latency_bisection_still_measures_the_endpoints_every_round(tmp_path: Path) -> None:
    n, culprit = 16, 5
    state, measured = _bisect(n, FakeCounter(culprit), "latency", tmp_path)
    final = outcome(state)
    assert final is not None and final.culprits[0][0] == _sha(culprit)
    for r in range(state.round):
        this_round = [p for p in state.probes if p.round == r]
        assert {0, n} <= {p.index for p in this_round}
        for probe in this_round:
            if 0 < probe.index < n:
                assert probe.results[0].reference_rounds == (r,)
    ends = Counter(measured)
    assert ends[_sha(0)] == ends[_sha(n)] == state.round
    assert any(p.purpose == "verify" for p in state.probes)


def test_a_build_whose_count_fails_is_a_failed_build_counted_once(tmp_path: Path) -> None:
    # The first midpoint fails under valgrind: the search steps around it, never counts it again.
    state, counted = _bisect(16, FakeCounter(5, broken=frozenset({8})), INSTRUCTIONS, tmp_path)
    final = outcome(state)
    assert final is not None and final.culprits[0][0] == _sha(5)
    assert set(Counter(counted).values()) == {1}
    assert (_sha(8), "sac:eval:cpu") in state.errors
    # A bad endpoint that fails to count leaves nothing to compare with.
    state, counted = _bisect(16, FakeCounter(5, broken=frozenset({16})), INSTRUCTIONS, tmp_path)
    final = outcome(state)
    assert final is not None and final.kind == INCONCLUSIVE
    assert "the bad endpoint failed to measure" in final.benchmarks[0].reason
    assert sorted(counted) == [_sha(0), _sha(16)]


def test_a_verification_the_stored_counts_cannot_pass_is_inconclusive(tmp_path: Path) -> None:
    # Four counts a side place the step (its interval clears 5%) but cannot reach the
    # verification's p <= 0.01 (4 against 4 gives 2/70 at best): counting the builds again would
    # say the same, so the one-commit range ends inconclusive, nothing counted twice.
    state, counted = _bisect(1, FakeCounter(1), INSTRUCTIONS, tmp_path, samples=4)
    final = outcome(state)
    assert final is not None and final.kind == INCONCLUSIVE
    (answer,) = final.benchmarks
    assert answer.reason.startswith("verification failed: the stored counts of the parent")
    assert answer.range == (_sha(1),)
    assert sorted(counted) == [_sha(0), _sha(1)]


def test_a_night_count_bisection_stores_probes_for_new_builds_only(session: Session) -> None:
    n, culprit = 8, 3
    commits = [{"sha": _sha(i), "title": f"change {i}"} for i in range(n + 1)]
    bisection = celery_driver.create_bisection(
        session,
        commits=commits,
        benchmarks=["sac:eval:cpu"],
        provider={"kind": "checkout", "repo": "/nowhere", "install_command": ""},
        config=celery_driver.night_search_config(celery_driver.get_settings(), INSTRUCTIONS),
        metric=INSTRUCTIONS,
    )
    assert bisection.config["search"]["measure_once"] is True  # from the metric's row
    for _ in range(20):
        if celery_driver.advance(session, bisection_id=bisection.id).finished:
            break
        for probe in session.scalars(
            select(Probe).where(Probe.bisection_id == bisection.id, Probe.status == "queued")
        ):
            probe.status = "done"
            probe.samples = {
                name: _counts(probe.index, culprit, probe.samples_wanted)
                for name in probe.benchmarks
            }
        session.flush()
    session.refresh(bisection)
    assert bisection.outcome == "culprit"
    rows = session.scalars(select(Probe).where(Probe.bisection_id == bisection.id)).all()
    assert sorted(Counter(p.sha for p in rows).values()) == [1] * len(rows)
    assert len(rows) <= math.ceil(math.log2(n + 1)) + 2
    # The stored verdicts of the probes name the endpoint counts they reused.
    later = [p for p in bisection.result["probes"] if p["round"] > 0]
    assert later and all(r["reference_rounds"] == [0] for p in later for r in p["results"])
