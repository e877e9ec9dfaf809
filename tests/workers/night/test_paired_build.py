"""Which build a confirmation re-run is paired with (Postgres): a pinned spec names its build;
two nights on ``current`` are paired only when their records show the same code."""

from __future__ import annotations

import itertools
import random
from datetime import date, timedelta
from typing import Any

import pytest

from service.config import Settings
from service.db import session_scope
from service.models import Run
from service.runs import service as runs
from service.runs.service import BenchmarkSpec
from tests.nights import ENV, store_latency
from workers.night.finish import paired_build

DQN = BenchmarkSpec(model="dqn", mode="eval")
SAC = BenchmarkSpec(model="sac", mode="train")
BUILD = "553635d5034bdd2f"
OTHER = "0123456789abcdef"
_FIRST_NIGHTS = (date(2026, 10, 1) + timedelta(days=2 * i) for i in itertools.count())


def _nights(
    previous: dict[str, dict[str, Any] | None],
    tonight: dict[str, dict[str, Any] | None],
    *,
    previous_spec: str = "current",
    tonight_spec: str = "current",
    commit_range: list[dict[str, Any]] | None = None,
) -> int:
    """Two nights of dqn eval and sac train; each benchmark's record carries the environment
    given for it (None: no result that night). Returns tonight's run id."""
    run_id = 0
    first = next(_FIRST_NIGHTS)
    for day, (spec, environments) in enumerate(
        [(previous_spec, previous), (tonight_spec, tonight)]
    ):
        with session_scope() as session:
            run = runs.create_run(
                session,
                night=first + timedelta(days=day),
                benchmarks=[DQN, SAC],
                torch_spec=spec,
                commit_range=commit_range if day == 1 else None,
            )
            for benchmark in (DQN, SAC):
                environment = environments.get(benchmark.model)
                if environment is not None:
                    store_latency(
                        session,
                        run,
                        10.0,
                        random.Random(run.id),
                        spec=benchmark,
                        environment=environment,
                    )
            runs.finish_run(session, run=run)
            run_id = run.id
    return run_id


def _paired(run_id: int, benchmarks: list[BenchmarkSpec], **settings: Any) -> tuple[Any, Any]:
    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None and run.previous_run_id is not None
        return paired_build(session, run=run, settings=Settings(**settings), benchmarks=benchmarks)


def _env(fingerprint: str | None = BUILD, **more: Any) -> dict[str, Any]:
    env = {**ENV, **more}
    if fingerprint is not None:
        env["build_fingerprint"] = fingerprint
    return env


def test_two_nights_on_current_that_ran_the_same_code_are_paired(database_url: str) -> None:
    same = {"dqn": _env(), "sac": _env()}
    run_id = _nights(same, same)
    assert _paired(run_id, [DQN]) == ("current", BUILD)
    assert _paired(run_id, [DQN, SAC]) == ("current", BUILD)
    # The setting still rules.
    assert _paired(run_id, [DQN], paired_confirmation=False) == (None, None)


@pytest.mark.parametrize(
    ("previous", "tonight", "why"),
    [
        ({"dqn": _env(), "sac": _env()}, {"dqn": _env(OTHER), "sac": _env()}, "new code"),
        # The harness's planted work is part of what a record measured.
        (
            {"dqn": _env(), "sac": _env()},
            {"dqn": _env(injected_work=0.5), "sac": _env()},
            "planted work",
        ),
        # Records without a fingerprint (older records, other tools): the code is unknown.
        ({"dqn": _env(None), "sac": _env()}, {"dqn": _env(None), "sac": _env()}, "unknown"),
        ({"dqn": _env(), "sac": _env()}, {"dqn": _env(None), "sac": _env()}, "unknown tonight"),
        # No result of the benchmark on one night: nothing says what it ran.
        ({"dqn": None, "sac": _env()}, {"dqn": _env(), "sac": _env()}, "not measured"),
    ],
)
def test_two_nights_on_current_that_ran_other_or_unknown_code_go_unpaired(
    database_url: str,
    previous: dict[str, Any],
    tonight: dict[str, Any],
    why: str,
) -> None:
    run_id = _nights(previous, tonight)
    assert _paired(run_id, [DQN]) == (None, None), why
    # Only the benchmarks re-run decide: sac's code did not change.
    assert _paired(run_id, [SAC]) == ("current", BUILD), why
    assert _paired(run_id, [DQN, SAC]) == (None, None), why


def test_a_night_given_its_commit_range_or_a_pinned_build_on_one_side(database_url: str) -> None:
    same = {"dqn": _env(), "sac": _env()}
    commits = [{"sha": "a" * 40}, {"sha": "b" * 40}]
    # Planned with its commits (as `nightbench demo` plans its last night): its code changed.
    assert _paired(_nights(same, same, commit_range=commits), [DQN]) == (None, None)
    # A pinned previous night names its build: paired with it, whatever the records say.
    pinned = _nights(same, {"dqn": _env(OTHER), "sac": _env()}, previous_spec="torch==2.13.0")
    assert _paired(pinned, [DQN]) == ("torch==2.13.0", None)
    # Tonight pinned after a night on `current`: the worker cannot rebuild that night's build.
    assert _paired(_nights(same, same, tonight_spec="torch==2.13.0"), [DQN]) == (None, None)
    # No benchmark to compare: nothing shows the code was the same.
    assert _paired(_nights(same, same), []) == (None, None)
