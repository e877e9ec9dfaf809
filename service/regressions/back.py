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
  within half the regression's step of the regression's baseline: a fix or a revert.

:func:`note_back` records the night on the regression (``back_night``, ``back_reason``); the
filing then tells the regression's open issue once (:mod:`workers.issues.filing`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import date, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Confirmation, Regression, Run
from service.regressions.detection import Assessment
from service.regressions.service import Assessed

#: A regression whose first night lies this many nights before the first night the detector
#: located for the step the series came back from still counts as that step (the nightly
#: locates a first night from the nights it had then; the replay from every night since).
FIRST_NIGHT_SLACK = timedelta(days=3)


def note_back(session: Session, *, run: Run, assessed: Sequence[Assessed]) -> list[Regression]:
    """Record, on each regressed series of ``run`` found back tonight, its regression's return.

    For each ``(result, assessment, ..., back_result)`` of ``run``'s results
    (:func:`service.regressions.service.assess_run`): when the assessment
    says the series came back from a raised step (``back_from``; ``back_result`` is the result
    of that step's first night), or raises an improvement whose new level (``baseline *
    (1 + step_change)``) lies within half the regression's step of the regression's baseline
    (on the log scale), the series' latest reproduced regression before tonight that is not yet
    back gets ``back_night`` (tonight) and ``back_reason``. For a step the series came back
    from, that regression must have begun no earlier than ``FIRST_NIGHT_SLACK`` before the
    step's first night: an older regression is another step.

    Idempotent: a regression already back is left as it is. Only flushes.

    Returns:
        The regressions found back tonight.
    """
    out = []
    for result, assessment, *_, back_result in assessed:
        if result.series_key is None:
            continue
        since = None
        if assessment.back_from is not None and back_result is not None:
            since = back_result.night - FIRST_NIGHT_SLACK
        elif not (assessment.verdict == "improvement" and assessment.confirmed):
            continue
        regression = _latest_open(session, series_key=result.series_key, before=run.night,
                                  since=since)
        if regression is None:
            continue
        if since is not None:
            reason = (f"{assessment.reason} Unless a fix or a revert landed in these nights, "
                      "the step was most likely the measuring host's, not a commit's.")
        elif _undoes(assessment, regression):
            reason = (f"{assessment.reason} Its new level is within half the step of the "
                      f"baseline from before the regression: a fix or a revert landed.")
        else:
            continue
        regression.back_night, regression.back_reason = run.night, reason
        out.append(regression)
    session.flush()
    return out


def _latest_open(session: Session, *, series_key: str, before: date,
                 since: date | None) -> Regression | None:
    """The series' latest reproduced regression recorded before night ``before`` and not yet
    back (beginning on ``since`` or later when given)."""
    query = (select(Regression).join(Run, Run.id == Regression.run_id).where(
        Regression.series_key == series_key, Regression.direction == "regression",
        Regression.confirmation == Confirmation.REPRODUCED, Regression.back_night.is_(None),
        Run.night < before).order_by(Run.night.desc(), Regression.id.desc()).limit(1))
    regression = session.scalar(query)
    if regression is None or since is None:
        return regression
    first = regression.first_night or session.get(Run, regression.run_id).night  # type: ignore[union-attr]
    return regression if first >= since else None


def _undoes(improvement: Assessment, regression: Regression) -> bool:
    """Whether a raised improvement's new level is within half ``regression``'s step of the
    baseline from before it (on the log scale)."""
    if improvement.baseline is None or improvement.step_change is None:
        return False
    level = improvement.baseline * (1 + improvement.step_change)
    if level <= 0 or regression.baseline <= 0 or regression.change <= 0:
        return False
    return abs(math.log(level / regression.baseline)) <= 0.5 * math.log1p(regression.change)
