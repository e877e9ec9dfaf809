"""A real slowdown is caught, a small one is not raised for itself: injected work measured for real.

The harness's ``NIGHTBENCH_SUITE_INJECT_WORK`` adds matmuls to every timed iteration, lasting
the given fraction of that iteration's model step: real extra work on this CPU, measured by the same
subprocesses, stored, and judged by the same detector as any night.

The planted step is +100%: large enough that the detector raises it within a few nights even
when the host running the tests strays from night to night. +40% was not always: on this
machine while its host was busy, resnet18 eval's baseline nights spread so widely (medians
about 33 to 45 ms against a quiet 22 ms) that a night and its re-run at +35% stood inside the
baseline's own range and were not called a reproduced step (a +20% step on a host straying
5% a night is alerted by its third night in only 60-90% of series; `benchmarks/nightly_flow.py`,
docs/benchmarks.md). How small a step is caught how soon is the detector's measured figure,
not this test's: here the whole path (measure, store, detect, confirm, locate, file) is run.
"""

from __future__ import annotations

from datetime import date

import pytest
from sqlalchemy import select

from service.db import session_scope
from service.models import Alert, Regression, Result, Run
from service.regressions.service import range_start
from service.runs.service import BenchmarkSpec
from workers.night import plan as nightly

SPECS = [
    BenchmarkSpec(model="resnet18", mode="eval"),
    BenchmarkSpec(model="resnet18", mode="train"),
]


def _night(day: int) -> int:
    run_id = nightly.create_night(night=date(2026, 10, day), benchmarks=SPECS)
    for job_id, queue, _ in nightly.queued_jobs(run_id):
        nightly.send_job(job_id, queue)
    return run_id


@pytest.mark.measured
def test_a_doubling_is_flagged_two_percent_is_not(
    database_url: str, monkeypatch: pytest.MonkeyPatch, configure, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    # Thirteen nights minutes apart on a shared CPU spread by more than the 7% stability rule,
    # and the nightly re-check would rightly darken resnet18 (alerted only beyond its noise). What this
    # test follows is detection to filing; the re-check has its own tests on literal nights.
    configure(stability_recheck="false")
    for day in range(1, 9):
        _night(day)
    monkeypatch.setenv("NIGHTBENCH_SUITE_INJECT_WORK", "resnet18:eval=1.0,resnet18:train=0.02")
    # The +100% must be alerted within its first five nights: on its first night when the
    # confirmation re-run reproduces it, else as the nights at the new level add up. On a
    # shared CPU a night can stray by ~10%, and the detector waits for evidence at p <= 0.01
    # rather than guess (issue 5); a night or a re-run that comes out low must not lose it.
    seen: list[str] = []
    alert = None
    for day in (9, 10, 11, 12, 13):
        run_id = _night(day)
        with session_scope() as session:
            # The alert that holds the planted step: an earlier one may hold only what a
            # straying host reproduced (every filed latency issue is checked below).
            alert = session.scalar(
                select(Alert)
                .join(Regression, Regression.alert_id == Alert.id)
                .where(
                    Alert.run_id == run_id,
                    Alert.kind == "regression",
                    Regression.mode == "eval",
                    Regression.metric == "latency",
                    Regression.direction == "regression",
                )
            )
            tonight = session.scalar(
                select(Regression).where(
                    Regression.run_id == run_id,
                    Regression.direction == "regression",
                    Regression.mode == "eval",
                    Regression.metric == "latency",
                )
            )
            seen.append(f"night {day}: " + (tonight.reason if tonight else "no candidate"))
            if alert is not None:
                break
    with session_scope() as session:
        if alert is None:  # every night's eval latency, to tell a straying host from a miss
            seen += [
                f"{r.night} {r.median:.2f} ms{' ' + r.error if r.error else ''}"
                for r in session.scalars(
                    select(Result)
                    .where(
                        Result.model == "resnet18",
                        Result.mode == "eval",
                        Result.metric == "latency",
                    )
                    .order_by(Result.id)
                )
                if r.median is not None or r.error
            ]
        assert alert is not None, "+100% not alerted by its fifth night: " + " | ".join(seen)
        assert alert.status == "filed"
        latency = session.scalar(
            select(Regression).where(
                Regression.alert_id == alert.id,
                Regression.mode == "eval",
                Regression.metric == "latency",
            )
        )
        assert latency is not None, seen
        # Nominally +100%; one process's figure strays by 10% or more on a shared CPU.
        assert latency.change > 0.15, latency.reason
        # Its first night is located from noisy nights: the step's own, or a night off when
        # one came out high or low by chance. Whichever, the commit range to search must hold
        # the change, which came between the builds of Oct 8 and Oct 9.
        assert date(2026, 10, 8) <= latency.first_night <= date(2026, 10, 10), latency.reason
        start = range_start(session, run=session.get(Run, run_id))
        assert start is not None and start.night <= date(2026, 10, 8), latency.first_night
        in_alert = session.scalars(select(Regression).where(Regression.alert_id == alert.id)).all()
        alerted = {(r.model, r.mode, r.metric) for r in in_alert}
        assert ("resnet18", "eval", "latency") in alerted
        # Injected work costs time, not memory: no peak-memory step may come with it.
        assert ("resnet18", "eval", "cpu_peak_mem") not in alerted, [
            r.reason for r in in_alert if r.metric == "cpu_peak_mem"
        ]
        # The +2% step is real work too. It is never alerted for what it is: a candidate needs a
        # measured step beyond the 7% threshold and a re-run that reproduces it. Over the minutes
        # this test runs, the host itself can drift by more than 5% (a neighbour starting on a shared
        # CPU), and then the measured step does exceed 7% on the night and on its re-run; the
        # detector is right to raise what was measured, and this test cannot tell the two apart.
        # What must hold whatever the host does: nothing under the threshold reaches the alert.
        train = session.scalars(
            select(Regression).where(
                Regression.mode == "train",
                Regression.metric == "latency",
                Regression.direction == "regression",
            )
        ).all()
        for r in train:
            if r.alert_id is not None:
                assert r.change >= r.threshold and r.confirmation == "reproduced", r.reason
        train_alerted = any(r.alert_id is not None for r in train)
        run = session.get(Run, run_id)
        assert run is not None and run.status == "complete"
    outbox = [p.read_text() for p in (tmp_path / "nightbench" / "outbox").glob("*.md")]
    # Latency: the planted step is filed once, by the night that raised it. Peak memory on this
    # CPU host is multimodal from process to process; it is judged by its levels and their
    # frequencies (tested on literal series elsewhere) and left out here, not out of the
    # assertions above.
    filed_latency = [t for t in outbox if " latency " in t.split("\n", 3)[2]]
    titles = [t.split("\n", 3)[2] for t in outbox]
    planted = [t for t in filed_latency if f"<!-- nightbench:run={run_id} -->" in t]
    assert len(planted) == 1, titles
    assert "resnet18 eval cpu latency" in (
        planted[0] if train_alerted else planted[0].split("\n", 3)[2]
    )
    # A night and its re-run minutes later can both stray beyond the threshold on a shared
    # host (once in CI, resnet18 train at +29.7% on the fifth night, before any work was
    # injected, was reproduced and filed): the detector files what it measured twice, and this
    # test cannot tell that from a change. What must hold for every latency issue filed: each
    # of its changes was measured beyond the threshold and reproduced.
    with session_scope() as session:
        for r in session.scalars(
            select(Regression).where(
                Regression.alert_id.is_not(None),
                Regression.metric == "latency",
                Regression.direction == "regression",
            )
        ):
            assert r.change >= r.threshold and r.confirmation == "reproduced", (r.reason, titles)

    # Triage from the CLI: listed, marked expected, bad input refused with the reason.
    from typer.testing import CliRunner

    from workers.cli import app

    runner = CliRunner()
    listed = runner.invoke(app, ["regressions", "list", "--json", "--run", str(run_id)])
    assert listed.exit_code == 0, listed.output
    import json

    ids = {r["id"] for r in json.loads(listed.output) if r["direction"] == "regression"}
    assert latency.id in ids
    done = runner.invoke(app, ["regressions", "set", str(latency.id), "expected"])
    assert done.exit_code == 0, done.output
    bad = runner.invoke(app, ["regressions", "set", str(latency.id), "meh"])
    assert bad.exit_code == 2 and "state must be one of" in bad.output
    with session_scope() as session:
        stored = session.get(Regression, latency.id)
        assert stored is not None and stored.state == "expected"
