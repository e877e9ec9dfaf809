"""The issue trackers: PyGithub against a local GitHub stand-in, and the Markdown outbox."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import SecretStr

from service.config import Settings
from service.errors import InfrastructureError, InvalidInput, NotFound, TrackerAccessDenied
from tests.github_server import FakeGitHub
from workers.issues.model import (
    Bisection,
    Change,
    Commit,
    Environment,
    IssueReport,
    RenderedIssue,
)
from workers.issues.render.regression import render_issue
from workers.issues.trackers import IssueTracker, make_tracker
from workers.issues.trackers.github import GitHubTracker
from workers.issues.trackers.markers import comment_marker, marker
from workers.issues.trackers.outbox import OutboxTracker

TOKEN = "ghp_never_log_me_0123456789abcdefABCDEF"
REPO = "octo-org/perf"
ISSUES = r"/repos/octo-org/perf/issues"
ONE_ISSUE = r"/repos/octo-org/perf/issues/\d+"


def rendered(fp: str = "00000000000000aa", title: str = "[perf] a regression") -> RenderedIssue:
    body = f"Something got slower.\n\n{marker(fp)}\n"
    return RenderedIssue(
        title=title, body=body, labels=("performance", "regression"), fingerprint=fp
    )


def real_issue() -> RenderedIssue:
    """An issue rendered by the real renderer, for the same-Markdown-everywhere checks."""
    culprit = Commit(
        "abc1234" + "0" * 33, "Add validity check (#61056)", "Jane Doe", "janedoe", 61056
    )
    change = Change("hf_Bert", "train", "cuda", "latency", "ms", 100.0, 112.4, machine="gpu-1")
    report = IssueReport(
        regressions=(change,),
        night=date(2026, 11, 21),
        tonight=Environment(torch_version="2.13.0"),
        bisection=Bisection(
            "culprit", Commit("1" * 40), Commit("2" * 40), commits=12, culprit=culprit
        ),
    )
    return render_issue(report)


@pytest.fixture
def fake() -> Iterator[FakeGitHub]:
    with FakeGitHub(token=TOKEN) as server:
        yield server


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


def make(fake: FakeGitHub, sleeps: Sleeps, **kw: object) -> GitHubTracker:
    options: dict[str, object] = {
        "api_url": fake.base_url,
        "backoff_factor": 0.01,
        "seconds_between_requests": None,
        "seconds_between_writes": None,
        "sleep": sleeps,
        "timeout": 10,
    }
    options.update(kw)
    return GitHubTracker(REPO, SecretStr(TOKEN), **options)  # type: ignore[arg-type]


@pytest.fixture
def tracker(fake: FakeGitHub, sleeps: Sleeps) -> GitHubTracker:
    return make(fake, sleeps)


# ----- filing ---------------------------------------------------------------------------------


def test_create_files_issue_with_labels_through_the_enterprise_base_url(
    fake: FakeGitHub, tracker: GitHubTracker
) -> None:
    issue = real_issue()
    filed = tracker.create(issue)
    assert isinstance(tracker, IssueTracker)
    assert filed.number == 1 and filed.state == "open"
    assert filed.fingerprint == issue.fingerprint
    assert filed.labels == ("performance", "regression")
    assert filed.url == f"{fake.origin}/octo-org/perf/issues/1"
    stored = fake.issues[1]
    assert stored["title"] == issue.title and stored["body"] == issue.body
    [post] = fake.requests_to("POST", ISSUES)
    assert post.body["labels"] == ["performance", "regression"]
    # Every request went under the /api/v3 prefix (the fake 404s anything else) with the token.
    assert all(r.headers.get("Authorization") == f"token {TOKEN}" for r in fake.requests)


def test_create_returns_the_open_issue_already_carrying_the_fingerprint(
    fake: FakeGitHub, tracker: GitHubTracker
) -> None:
    first = tracker.create(rendered("00000000000000aa"))
    again = tracker.create(rendered("00000000000000aa", title="[perf] same thing, next night"))
    assert again.number == first.number
    assert len(fake.issues) == 1
    assert len(fake.requests_to("POST", ISSUES)) == 1


def test_find_open_matches_the_marker_not_the_title(
    fake: FakeGitHub, tracker: GitHubTracker
) -> None:
    tracker.create(rendered("00000000000000aa", title="[perf] one"))
    tracker.create(rendered("00000000000000bb", title="[perf] one"))
    fake._create_issue({"title": "[perf] one", "body": "no marker", "labels": ["performance"]})
    found = tracker.find_open("00000000000000bb")
    assert found is not None and found.number == 2
    assert tracker.find_open("00000000000000cc") is None
    fake.close_issue(2)
    assert tracker.find_open("00000000000000bb") is None
    # Lookups list only issues with the search label, which every filed issue carries.
    assert all(r.query.get("labels") == ["performance"] for r in fake.requests_to("GET", ISSUES))


def test_find_open_follows_pagination(sleeps: Sleeps) -> None:
    with FakeGitHub(token=TOKEN, per_page_max=2) as fake:
        tracker = make(fake, sleeps)
        for i in range(5):
            tracker.create(rendered(f"00000000000000{i:02x}"))
        # Newest first, two per page: the oldest issue is on page 3.
        fake.requests.clear()
        found = tracker.find_open("0000000000000000")
        assert found is not None and found.number == 1
        pages = [r.query.get("page", ["1"])[0] for r in fake.requests_to("GET", ISSUES)]
        assert pages == ["1", "2", "3"]


def test_recurrence_comments_once_per_key_instead_of_a_second_issue(
    fake: FakeGitHub, tracker: GitHubTracker
) -> None:
    issue = rendered()
    filed = tracker.create(issue)
    tonight = tracker.find_open(issue.fingerprint)
    assert tonight is not None and tonight.number == filed.number
    tracker.comment(tonight.number, "Still regressed on 2026-11-22.", key="run-2")
    tracker.comment(tonight.number, "Still regressed on 2026-11-22.", key="run-2")
    tracker.comment(tonight.number, "Still regressed on 2026-11-23.", key="run-3")
    assert len(fake.issues) == 1
    bodies = [c["body"] for c in fake.comments[filed.number]]
    assert len(bodies) == 2
    assert bodies[0].startswith("Still regressed on 2026-11-22.")
    assert comment_marker("run-2") in bodies[0] and comment_marker("run-3") in bodies[1]
    with pytest.raises(InvalidInput, match="comment key"):
        tracker.comment(filed.number, "x", key="two words")


def test_add_labels_keeps_existing_ones(fake: FakeGitHub, tracker: GitHubTracker) -> None:
    filed = tracker.create(rendered())
    tracker.add_labels(filed.number, ["oncall: pt2", "performance", "oncall: pt2"])
    names = [label["name"] for label in fake.issues[filed.number]["labels"]]
    assert names == ["performance", "regression", "oncall: pt2"]
    assert tracker.get(filed.number).labels == ("performance", "regression", "oncall: pt2")
    [post] = fake.requests_to("POST", ONE_ISSUE + "/labels")
    assert post.body == ["oncall: pt2", "performance"]


def test_missing_issue_and_repository_are_not_found(fake: FakeGitHub, sleeps: Sleeps) -> None:
    tracker = make(fake, sleeps)
    with pytest.raises(NotFound, match="404 while reading issue #7"):
        tracker.get(7)
    other = GitHubTracker(
        "octo-org/nope", TOKEN, api_url=fake.base_url, seconds_between_requests=None
    )
    with pytest.raises(TrackerAccessDenied, match="octo-org/nope.*NIGHTBENCH_GITHUB_REPOSITORY"):
        other.find_open("00000000000000aa")


# ----- sync-back listing ----------------------------------------------------------------------


def test_updated_since_lists_closed_labelled_and_reopened_issues(
    fake: FakeGitHub, tracker: GitHubTracker
) -> None:
    fixed = tracker.create(rendered("00000000000000aa"))
    noise = tracker.create(rendered("00000000000000bb"))
    fake._create_issue({"title": "unrelated", "body": "hello", "labels": ["performance"]})
    start = datetime.now(UTC).replace(microsecond=0)

    fake.close_issue(fixed.number)
    fake.label_issue(noise.number, "invalid")
    fake.close_issue(noise.number, reason="not_planned")
    seen = {i.number: i for i in tracker.updated_since(start)}
    assert set(seen) == {fixed.number, noise.number}  # the unmarked issue is not ours
    assert seen[fixed.number].state == "closed"
    assert seen[fixed.number].state_reason == "completed"
    assert seen[noise.number].labels == ("performance", "regression", "invalid")
    assert seen[noise.number].state_reason == "not_planned"
    assert seen[noise.number].fingerprint == "00000000000000bb"

    fake.reopen_issue(fixed.number)
    again = {i.number: i for i in tracker.updated_since(start)}
    assert again[fixed.number].state == "open"
    assert again[fixed.number].state_reason == "reopened"

    assert tracker.updated_since(datetime.now(UTC) + timedelta(hours=1)) == []
    with pytest.raises(InvalidInput, match="timezone-aware"):
        tracker.updated_since(datetime(2026, 1, 1))
    since = fake.requests_to("GET", ISSUES)[-1].query["since"][0]
    assert since.endswith("Z") and since.startswith("20")


# ----- failures, retries and rate limits ------------------------------------------------------


def test_502_on_create_then_success_files_exactly_one_issue(
    fake: FakeGitHub, tracker: GitHubTracker, sleeps: Sleeps
) -> None:
    fake.fail("POST", ISSUES, status=502)
    filed = tracker.create(rendered())
    assert filed.number == 1
    assert len(fake.issues) == 1
    assert len(fake.requests_to("POST", ISSUES)) == 2
    # Before resending, it looked again for the marker (the failed create might have landed).
    methods = [r.method for r in fake.requests if r.path == "/repos/octo-org/perf/issues"]
    assert methods == ["GET", "POST", "GET", "POST"]
    assert sleeps == [0.01]


def test_create_that_landed_behind_a_502_is_not_sent_again(
    fake: FakeGitHub, tracker: GitHubTracker
) -> None:
    fake.fail("POST", ISSUES, status=502, after=True)
    filed = tracker.create(rendered())
    assert filed.number == 1
    assert len(fake.issues) == 1
    assert len(fake.requests_to("POST", ISSUES)) == 1


def test_comment_that_landed_behind_a_504_is_not_posted_twice(
    fake: FakeGitHub, tracker: GitHubTracker
) -> None:
    filed = tracker.create(rendered())
    fake.fail("POST", ONE_ISSUE + "/comments", status=504, after=True)
    tracker.comment(filed.number, "Still regressed.", key="run-9")
    assert len(fake.comments[filed.number]) == 1


def test_reads_are_retried_by_pygithub_on_5xx(fake: FakeGitHub, tracker: GitHubTracker) -> None:
    tracker.create(rendered())
    fake.requests.clear()
    fake.fail("GET", ISSUES, status=503, times=2)
    assert tracker.find_open("00000000000000aa") is not None
    assert len(fake.requests_to("GET", ISSUES)) == 3


def test_persistent_5xx_gives_up_with_a_clear_error(fake: FakeGitHub, sleeps: Sleeps) -> None:
    tracker = make(fake, sleeps, write_attempts=3)
    fake.fail("POST", ISSUES, status=502, times=10, message="Bad Gateway")
    with pytest.raises(InfrastructureError, match="502 while filing an issue in octo-org/perf"):
        tracker.create(rendered())
    assert len(fake.requests_to("POST", ISSUES)) == 3
    assert fake.issues == {}
    assert sleeps == [0.01, 0.02]


def test_primary_rate_limit_403_is_waited_out_until_reset(
    fake: FakeGitHub, tracker: GitHubTracker
) -> None:
    reset = fake.rate_limit("GET", ISSUES, status=403, reset_in=1.0)
    assert tracker.find_open("00000000000000aa") is None
    first, second = fake.requests_to("GET", ISSUES)
    assert second.at >= reset, "retried before the announced X-RateLimit-Reset"


def test_rate_limited_create_429_is_waited_out_and_files_once(
    fake: FakeGitHub, tracker: GitHubTracker
) -> None:
    reset = fake.rate_limit("POST", ISSUES, status=429, reset_in=1.0)
    filed = tracker.create(rendered())
    assert filed.number == 1 and len(fake.issues) == 1
    first, second = fake.requests_to("POST", ISSUES)
    assert second.at >= reset


def test_secondary_rate_limit_honours_retry_after(fake: FakeGitHub, tracker: GitHubTracker) -> None:
    filed = tracker.create(rendered())
    fake.rate_limit(
        "POST", ONE_ISSUE + "/comments", status=403, retry_after=1, secondary=True, reset_in=0
    )
    tracker.comment(filed.number, "Still regressed.", key="run-2")
    first, second = fake.requests_to("POST", ONE_ISSUE + "/comments")
    assert second.at - first.at >= 1.0
    assert len(fake.comments[filed.number]) == 1


def test_rate_limit_longer_than_allowed_wait_fails_fast(fake: FakeGitHub, sleeps: Sleeps) -> None:
    tracker = make(fake, sleeps, max_rate_limit_wait=2.0)
    fake.rate_limit("GET", ISSUES, status=403, reset_in=600)
    with pytest.raises(InfrastructureError, match="rate limit while filing an issue"):
        tracker.create(rendered())
    assert fake.issues == {}


def test_token_never_reaches_logs_errors_or_repr(
    fake: FakeGitHub, sleeps: Sleeps, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    tracker = make(fake, sleeps)
    fake.fail("POST", ISSUES, status=502)
    fake.rate_limit("GET", ONE_ISSUE, status=403, reset_in=0)
    filed = tracker.create(rendered())
    tracker.get(filed.number)
    tracker.comment(filed.number, "Still regressed.", key="run-2")
    wrong = FakeGitHub(token="ghp_the_right_one").start()
    try:
        rejected = make(wrong, sleeps)
        with pytest.raises(InfrastructureError, match="rejected the token") as caught:
            rejected.find_open("00000000000000aa")
    finally:
        wrong.stop()
    assert "GET" in caplog.text  # PyGithub and urllib3 did log the requests at DEBUG
    assert TOKEN not in caplog.text
    assert TOKEN not in str(caught.value) and TOKEN not in repr(caught.value)
    assert TOKEN not in repr(tracker) and TOKEN not in str(vars(tracker))


def test_constructor_rejects_bad_configuration() -> None:
    with pytest.raises(InvalidInput, match="owner/name"):
        GitHubTracker("just-a-name", TOKEN)
    with pytest.raises(InvalidInput, match="token is empty"):
        GitHubTracker(REPO, SecretStr(""))


# ----- choosing a tracker ---------------------------------------------------------------------


def test_make_tracker_picks_github_outbox_or_refuses_half_a_configuration(
    tmp_path: Path,
) -> None:
    outbox = make_tracker(Settings(outbox_dir=tmp_path / "outbox"))
    assert isinstance(outbox, OutboxTracker) and outbox.directory == tmp_path / "outbox"
    github = make_tracker(
        Settings(
            github_repository=REPO,
            github_token=SecretStr(TOKEN),
            github_api_url="https://ghe.example.com/api/v3/",
            github_labels=["perf-nightly", "regression"],
        )
    )
    assert isinstance(github, GitHubTracker)
    assert github.api_url == "https://ghe.example.com/api/v3"
    assert github.search_label == "perf-nightly"
    with pytest.raises(InvalidInput, match="NIGHTBENCH_GITHUB_TOKEN is not set"):
        make_tracker(Settings(github_repository=REPO))
    with pytest.raises(InvalidInput, match="NIGHTBENCH_GITHUB_REPOSITORY is not set"):
        make_tracker(Settings(github_token=SecretStr(TOKEN)))


# ----- outbox ---------------------------------------------------------------------------------


def test_outbox_writes_the_same_markdown_github_gets(
    tmp_path: Path, fake: FakeGitHub, tracker: GitHubTracker
) -> None:
    issue = real_issue()
    outbox = OutboxTracker(tmp_path / "outbox")
    assert isinstance(outbox, IssueTracker)
    local = outbox.create(issue)
    remote = tracker.create(issue)
    text = Path(local.url).read_text()
    assert text.endswith(f"# {issue.title}\n\n{fake.issues[remote.number]['body']}")
    assert local.fingerprint == remote.fingerprint == issue.fingerprint
    assert local.labels == remote.labels
    assert outbox.create(issue).number == local.number  # found by fingerprint, not rewritten
    assert len(list((tmp_path / "outbox").glob("issue-*.md"))) == 1


def test_outbox_comments_labels_and_local_triage(tmp_path: Path) -> None:
    outbox = OutboxTracker(tmp_path)
    first = outbox.create(rendered("00000000000000aa"))
    second = outbox.create(rendered("00000000000000bb"))
    assert (first.number, second.number) == (1, 2)
    outbox.comment(first.number, "Still regressed on 2026-11-22.", key="run-2")
    outbox.comment(first.number, "Still regressed on 2026-11-22.", key="run-2")
    text = outbox.path(first.number).read_text()
    assert text.count("Still regressed on 2026-11-22.") == 1
    assert text.index(marker("00000000000000aa")) < text.index("Still regressed")
    outbox.add_labels(first.number, ["expected"])
    assert outbox.get(first.number).labels == ("performance", "regression", "expected")

    start = datetime.now(UTC) - timedelta(seconds=1)
    # A person closes issue 2 by editing its front matter.
    path = outbox.path(second.number)
    path.write_text(path.read_text().replace("state: open", "state: closed", 1))
    assert outbox.find_open("00000000000000bb") is None
    changed = {i.number: i for i in outbox.updated_since(start)}
    assert changed[second.number].state == "closed"
    assert outbox.find_open("00000000000000aa") is not None
    with pytest.raises(NotFound, match="outbox issue 9"):
        outbox.comment(9, "x", key="run-1")


def test_outbox_refuses_a_damaged_file_with_a_clear_error(tmp_path: Path) -> None:
    outbox = OutboxTracker(tmp_path)
    filed = outbox.create(rendered())
    path = outbox.path(filed.number)
    path.write_text(path.read_text().replace("state: open", "state: maybe", 1))
    with pytest.raises(InvalidInput, match="state 'maybe'"):
        outbox.get(filed.number)
    path.write_text("no front matter")
    with pytest.raises(InvalidInput, match="no front matter"):
        outbox.get(filed.number)


def test_a_label_dropped_by_github_is_reported(
    fake: FakeGitHub, tracker: GitHubTracker, caplog: pytest.LogCaptureFixture
) -> None:
    issue = RenderedIssue(
        "[perf] x", f"body\n\n{marker('00000000000000dd')}\n", ("regression",), "00000000000000dd"
    )
    tracker.create(issue)
    assert "filed without the label 'performance'" in caplog.text
