"""Confirmation re-runs decide what stays in a run's alert (Postgres)."""

from __future__ import annotations

import random
import re
from datetime import date

import pytest
from sqlalchemy import select

from service.db import session_scope
from service.models import Alert, Regression, Run
from service.regressions import service as regressions
from service.runs import rounds
from service.runs import service as runs
from service.series import series_history
from tests.nights import SPEC, store_latency


def _threshold(metric: str, benchmark: str) -> float:
    return 0.07


def _candidate_night(rng: random.Random) -> int:
    """Eight nights at 10 ms, then one at 13 ms: a candidate regression in an open alert."""
    for day in range(1, 10):
        with session_scope() as session:
            run = runs.create_run(session, night=date(2026, 9, day), benchmarks=[SPEC])
            store_latency(session, run, 10.0 if day < 9 else 13.0, rng)
            run_id = run.id
    with session_scope() as session:
        run = session.get(Run, run_id)
        assessed = regressions.assess_run(
            session, run=run, threshold_for=_threshold, baseline_nights=60
        )
        alert = regressions.record_regressions(
            session, run=run, assessed=assessed, threshold_for=_threshold
        )
        assert alert is not None and alert.summary.startswith("1 regression(s)")
    return run_id


def _rerun(
    session,
    parent_id: int,
    rerun_ms: float,
    rng: random.Random,  # type: ignore[no-untyped-def]
    options: dict | None = None,
) -> tuple[Run, Run]:
    """The candidate night's run and its confirmation run, measured at ``rerun_ms``."""
    parent = session.get(Run, parent_id)
    confirm = runs.create_run(
        session,
        night=parent.night,
        benchmarks=[SPEC],
        kind="confirm",
        parent_run_id=parent_id,
        options=options,
    )
    store_latency(session, confirm, rerun_ms, rng)
    return parent, confirm


@pytest.mark.parametrize(("rerun_ms", "reproduced"), [(13.0, True), (10.0, False)])
def test_confirmation_keeps_a_reproduced_regression_and_drops_a_blip_from_the_alert(
    database_url: str,
    rerun_ms: float,
    reproduced: bool,
) -> None:
    rng = random.Random(11)
    parent_id = _candidate_night(rng)
    with session_scope() as session:
        parent, confirm = _rerun(session, parent_id, rerun_ms, rng)
        got = regressions.apply_confirmation(
            session,
            parent=parent,
            confirm_run=confirm,
            threshold_for=_threshold,
            baseline_nights=60,
        )
    with session_scope() as session:
        (regression,) = session.scalars(select(Regression).where(Regression.run_id == parent_id))
        alert = session.scalar(select(Alert).where(Alert.run_id == parent_id))
        if reproduced:
            assert [r.id for r in got] == [regression.id]
            assert regression.confirmation == "reproduced" and regression.alertable
            assert alert is not None and regression.alert_id == alert.id
            assert alert.summary.startswith("1 regression(s)")
        else:
            assert got == []
            assert regression.confirmation == "not_reproduced" and not regression.alertable
            # The blip is kept for the record but is no longer part of any alert, and the
            # alert it left empty is gone.
            assert regression.alert_id is None and alert is None
            assert "Not reproduced by the confirmation re-run" in regression.reason


@pytest.mark.parametrize(
    ("previous_ms", "reproduced", "words"),
    [
        # The host was 28% slow all evening: the previous night's build is as slow beside the re-run.
        (
            12.8,
            False,
            r"tonight's build 13\.0\d ms \(1 process\) against 12\.\d\d ms \(2 processes\), "
            r"\+[0-3]\.\d%; the re-run was judged at the baseline's 10\.\d\d ms",
        ),
        # The previous build at its usual level beside the re-run: tonight's build is +30%.
        (
            10.0,
            True,
            r"tonight's build 13\.0\d ms \(1 process\) against (9\.9|10\.0)\d ms "
            r"\(2 processes\), \+(29|30|31)\.\d%",
        ),
        # Not measured (its build failed): judged unpaired, as before, and said so.
        (
            None,
            True,
            r"\(torch==2\.13\.0\) could not be measured beside the re-run; it was judged "
            r"unpaired",
        ),
    ],
)
def test_a_paired_re_run_is_judged_on_the_ratio_of_the_two_builds_measured_that_evening(
    database_url: str,
    previous_ms: float | None,
    reproduced: bool,
    words: str,
) -> None:
    rng = random.Random(12)
    parent_id = _candidate_night(rng)
    with session_scope() as session:
        parent, confirm = _rerun(session, parent_id, 13.0, rng, {"paired_spec": "torch==2.13.0"})
        for _ in range(2):  # two paired rounds: the previous build's level is their median
            beside = rounds.create_paired_round(
                session, parent=confirm, torch_spec="torch==2.13.0", rounds=2, deadline_s=None
            )
            if previous_ms is not None:
                store_latency(session, beside, previous_ms, rng)
            else:
                runs.end_job(
                    session,
                    job=runs.list_jobs(session, run_id=beside.id)[0],
                    error="build under test 'torch==2.13.0': no such build",
                )
        assert beside.torch_spec == "torch==2.13.0" and beside.options["origin"] == "paired"
        got = regressions.apply_confirmation(
            session,
            parent=parent,
            confirm_run=confirm,
            threshold_for=_threshold,
            baseline_nights=60,
        )
    with session_scope() as session:
        (regression,) = session.scalars(select(Regression).where(Regression.run_id == parent_id))
        assert (regression.confirmation == "reproduced") is reproduced
        assert bool(got) is reproduced and regression.alertable is reproduced
        reason = " ".join(regression.reason.split())
        assert re.search(words, reason), reason
        # The paired processes are no night of the series: its history holds the nine nights
        # and the re-run only.
        history = series_history(
            session,
            series_key=regression.series_key,
            night=date(2026, 9, 30),
            run_id=10**9,
            limit=60,
        )
        assert len(history) == 10 and all(r.run_id != beside.id for r in history)
