"""What an alert kind is to the filing pipeline: one row of :data:`workers.issues.kinds.KINDS`.

An alert is filed the same way whatever its kind (:func:`workers.issues.filing.file_alert`):

1. ``report``: queries only, one report (a :mod:`workers.issues.model` dataclass) per issue;
   nothing when the alert's issues were filed already (what is left then is comments).
2. ``fingerprint`` names each report's issue; ``render`` turns it into Markdown, purely.
3. ``file_issue`` hands the rendered issue to the tracker; the default asks the tracker, which
   returns the open issue already carrying the fingerprint instead of filing it twice.
4. ``comments``: what to tell open issues (data arrived, runs again, bisected, back), each
   posted once by its key.

Adding a kind of issue is a report, a render module and one row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from service.config import Settings
from service.models import Alert, Run
from workers.issues.model import Comment, FiledIssue, RenderedIssue
from workers.issues.trackers import IssueTracker

if TYPE_CHECKING:
    from workers.issues.reports.causes import BisectionInput


@dataclass(frozen=True)
class FilingContext:
    """One filing of one alert: the alert (locked), its run, the settings, and for a regression
    the bisection of its commit range (None: not bisected, or another kind)."""

    alert: Alert
    run: Run
    settings: Settings
    bisection: BisectionInput | None = None


def no_comments(
    session: Session,
    context: FilingContext,
    tracker: IssueTracker,
    filed: Mapping[str, FiledIssue],
) -> Sequence[Comment]:
    """A kind with nothing to tell its open issues."""
    return ()


def create_issue(
    session: Session,
    context: FilingContext,
    tracker: IssueTracker,
    report: Any,
    rendered: RenderedIssue,
) -> FiledIssue:
    """File ``rendered`` (the tracker returns the open issue carrying its fingerprint instead)."""
    issue = tracker.create(rendered)
    action = "created" if issue.run_id in (None, context.run.id) else "adopted"
    return FiledIssue(
        number=issue.number, url=issue.url, action=action, fingerprint=rendered.fingerprint
    )


@dataclass(frozen=True)
class AlertKindRow:
    """One kind of alert as the filing pipeline sees it.

    Attributes:
        labels: the kind's own labels, after the deployment's first
            (:func:`workers.issues.trackers.searchable_labels`).
        report: ``(session, context) -> [report, ...]``: one per issue to file; queries only.
        fingerprint: ``report -> 16 hex digits``: the issue's identity, for dedup.
        render: ``(report, fingerprint, labels) -> RenderedIssue``: pure Markdown.
        comments: ``(session, context, tracker, {fingerprint: issue filed now}) -> [Comment]``.
        file_issue: ``(session, context, tracker, report, rendered) -> FiledIssue``.
        has_news: ``(session, context) -> bool``: False leaves the alert as it is (a
            regression alert with nothing reproduced has nothing to file or tell).
        reads_bisection: the durable filing reads the night's finished bisection for it
            (:func:`workers.issues.reports.causes.night_bisection_input`) when none is given.
    """

    labels: tuple[str, ...]
    report: Callable[[Session, FilingContext], Sequence[Any]]
    fingerprint: Callable[[Any], str]
    render: Callable[[Any, str, tuple[str, ...]], RenderedIssue]
    comments: Callable[
        [Session, FilingContext, IssueTracker, Mapping[str, FiledIssue]], Sequence[Comment]
    ] = no_comments
    file_issue: Callable[[Session, FilingContext, IssueTracker, Any, RenderedIssue], FiledIssue] = (
        create_issue
    )
    has_news: Callable[[Session, FilingContext], bool] = lambda session, context: True
    reads_bisection: bool = False
