"""A regressed series back at its level from before the regression, found night by night.

A regression is filed once it persisted (its confirmation re-run, or the nights after it). Two
things can bring its series back afterwards, and the maintainers triaging its issue want to
know either way without reading the history:

* the step did not persist: the ``DetectorParams.return_nights`` nights with data right after
  the night it was raised on all stand within half the step of the baseline it was raised
  against (``Assessment.back_from``; the detector then resumes the baseline from before it).
  A two-night excursion of a straying host that its re-run on the same host reproduced looks
  like this, and so does a regression reverted within days;
* a later improvement was raised (it persisted, as improvements must) whose new level stands
  at most half the regression's step above the regression's baseline: a fix or a revert.

:func:`note_back` records the night on the regression (``back_night``, ``back_reason``); the
filing then tells the regression's open issue once (:mod:`workers.issues.filing`).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from datetime import date, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Confirmation, Regression, Result, Run
from service.regressions.detection import Assessment
from service.regressions.service import Assessed

#: A regression whose first night lies this many nights before the first night the detector
#: located for the step the series came back from still counts as that step (the nightly
#: locates a first night from the nights it had then; the replay from every night since).
FIRST_NIGHT_SLACK = timedelta(days=3)


def note_back(session: Session, *, run: Run, assessed: Sequence[Assessed]) -> list[Regression]:
    """Record, on each regressed series of ``run`` found back tonight, its regressions' return.

    For each ``(result, assessment, ..., back_result)`` of ``run``'s results
    (:func:`service.regressions.service.assess_run`), among the series' reproduced regressions
    recorded before tonight and not yet back (latest first):

    * when the assessment says the series came back from a raised step (``back_from``;
      ``back_result`` is the result of that step's first night), the latest, provided it began
      no earlier than ``FIRST_NIGHT_SLACK`` before that first night (an older one is another
      step);
    * when it raises an improvement, each regression its new level (``baseline * (1 +
      step_change)``) undoes, latest first: a level at most half the regression's step above
      the regression's baseline (log scale), a fix landing at or below it included.

    Each gets ``back_night`` (tonight) and ``back_reason``. Idempotent: a regression already
    back is left as it is. Only flushes.

    Returns:
        The regressions found back tonight.
    """
    out: list[Regression] = []
    for item in assessed:
        result, assessment, back_result = item.result, item.assessment, item.back_result
        came_back = assessment.back_from is not None and back_result is not None
        fixed = assessment.verdict == "improvement" and assessment.confirmed
        if result.series_key is None or not (came_back or fixed):
            continue
        standing = _not_back(session, series_key=result.series_key, before=run.night)
        if came_back:
            assert back_result is not None
            since = back_result.night - FIRST_NIGHT_SLACK
            found = standing[:1] if standing and _first_night(session, standing[0]) >= since else []
            why = (
                "Unless a fix or a revert landed in these nights, the step may not have been "
                "a commit's: a host that strays for a night or two looks like this."
            )
        else:
            found = list(itertools.takewhile(functools.partial(_undoes, assessment), standing))
            why = (
                "Its new level is no more than half the step above the baseline from before "
                "the regression: a fix or a revert landed" + _fix_range(session, item) + "."
            )
        for regression in found:
            regression.back_night = run.night
            regression.back_reason = f"{assessment.reason} {why}"
            out.append(regression)
    session.flush()
    return out


#: How many of a series' latest regressions not yet back an improvement is checked against.
STANDING_LOOKBACK = 10


def _not_back(session: Session, *, series_key: str, before: date) -> list[Regression]:
    """The series' reproduced regressions recorded before night ``before`` and not yet back,
    latest first (``STANDING_LOOKBACK`` at most)."""
    return list(
        session.scalars(
            select(Regression)
            .join(Run, Run.id == Regression.run_id)
            .where(
                Regression.series_key == series_key,
                Regression.direction == "regression",
                Regression.confirmation == Confirmation.REPRODUCED,
                Regression.back_night.is_(None),
                Run.night < before,
            )
            .order_by(Run.night.desc(), Regression.id.desc())
            .limit(STANDING_LOOKBACK)
        )
    )


def _fix_range(session: Session, item: Assessed) -> str:
    """`` between torch commits A (night) and B (night)``: the builds of a raised improvement's
    first night and of its series' night before it, when both are known; else nothing."""
    first = item.first_result
    if first is None or first.series_key is None:
        return ""
    before = session.scalar(
        select(Result)
        .where(Result.series_key == first.series_key, Result.night < first.night)
        .order_by(Result.night.desc(), Result.id.desc())
        .limit(1)
    )
    runs = [session.get(Run, r.run_id) for r in (before, first) if r is not None]
    commits = [(r.torch_git_commit, r.night) for r in runs if r is not None and r.torch_git_commit]
    if len(commits) != 2 or commits[0][0] == commits[1][0]:
        return ""
    (a, a_night), (b, b_night) = commits
    return f" between torch commits {a[:10]} ({a_night}) and {b[:10]} ({b_night})"


def _first_night(session: Session, regression: Regression) -> date:
    """The regression's first night at the new level (its run's night for older rows)."""
    if regression.first_night is not None:
        return regression.first_night
    run = session.get(Run, regression.run_id)
    assert run is not None  # a regression's run is its parent row
    return run.night


def _undoes(improvement: Assessment, regression: Regression) -> bool:
    """Whether a raised improvement's new level is at most half ``regression``'s step above
    the baseline from before it (on the log scale)."""
    if improvement.baseline is None or improvement.step_change is None:
        return False
    level = improvement.baseline * (1 + improvement.step_change)
    if level <= 0 or regression.baseline <= 0 or regression.change <= 0:
        return False
    return math.log(level / regression.baseline) <= 0.5 * math.log1p(regression.change)
