"""The alert kinds: one row each of the filing pipeline's table (:class:`AlertKindRow`).

===============  =========================  ==========================  ======================
kind             report (queries)           render (pure Markdown)      comments
===============  =========================  ==========================  ======================
regression       ``reports/regression.py``  ``render/regression.py``    recurrence, back
missing_data     ``reports/missing.py``     ``render/missing.py``       data arrived
failing          ``reports/failing.py``     ``render/failing.py``       runs again, bisected
===============  =========================  ==========================  ======================

:func:`workers.issues.filing.file_alert` reads the row of an alert's kind; nothing else tests
an alert's kind.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from service.models import AlertKind
from workers.issues import failing, missing
from workers.issues.back import back_comments
from workers.issues.kind import AlertKindRow, FilingContext
from workers.issues.model import RenderedIssue
from workers.issues.records import file_regression_issue
from workers.issues.render.failing import render_failing
from workers.issues.render.missing import render_missing_data
from workers.issues.render.regression import render_issue, report_fingerprint
from workers.issues.reports.regression import GroupReport, group_reports, reproduced


def _regression_reports(session: Session, context: FilingContext) -> list[GroupReport]:
    return group_reports(
        session,
        alert=context.alert,
        run=context.run,
        bisection=context.bisection,
        settings=context.settings,
    )


def _regression_render(
    item: GroupReport, fingerprint: str, labels: tuple[str, ...]
) -> RenderedIssue:
    # The regression report carries the deployment's labels and its own fingerprint.
    return render_issue(item.report)


KINDS: dict[str, AlertKindRow] = {
    AlertKind.REGRESSION: AlertKindRow(
        labels=(),
        report=_regression_reports,
        fingerprint=lambda item: report_fingerprint(item.report),
        render=_regression_render,
        comments=back_comments,
        file_issue=file_regression_issue,
        has_news=lambda session, context: bool(reproduced(session, context.alert.id)),
        reads_bisection=True,
    ),
    AlertKind.MISSING_DATA: AlertKindRow(
        labels=missing.LABELS,
        report=missing.reports,
        fingerprint=missing.report_fingerprint,
        render=lambda report, fp, labels: render_missing_data(
            report, fingerprint=fp, labels=labels
        ),
        comments=missing.arrival_comments,
    ),
    AlertKind.FAILING: AlertKindRow(
        labels=failing.LABELS,
        report=failing.reports,
        fingerprint=failing.report_fingerprint,
        render=lambda report, fp, labels: render_failing(report, fingerprint=fp, labels=labels),
        comments=failing.failing_comments,
    ),
}
"""Alert kind → its row. A kind not here cannot be filed (:class:`~service.errors.InvalidInput`)."""
