"""The A/B's GitHub side: PyGithub against the local GitHub stand-in, with injected faults."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pydantic import SecretStr

from service.errors import InfrastructureError, InvalidInput, NotFound, TrackerAccessDenied
from tests.github_server import FakeGitHub
from workers.ab.github import AB_MARKER, STATUS_CONTEXT, PullRequestReporter

TOKEN = "ghp_ab_reporter_not_secret_0123456789"
REPO = "octo-org/perf"
COMMENTS = r"/repos/octo-org/perf/issues/\d+/comments"
ONE_COMMENT = r"/repos/octo-org/perf/issues/comments/\d+"
BASE, MERGE_BASE, HEAD, HEAD2 = "b" * 40, "c" * 40, "d" * 40, "e" * 40


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def fake() -> Iterator[FakeGitHub]:
    with FakeGitHub(token=TOKEN) as server:
        yield server


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


def make(fake: FakeGitHub, sleeps: Sleeps, **kw: object) -> PullRequestReporter:
    options: dict[str, object] = {
        "api_url": fake.base_url,
        "retries": 3,
        "backoff_factor": 0.01,
        "write_attempts": 3,
        "seconds_between_requests": None,
        "seconds_between_writes": None,
        "sleep": sleeps,
        "timeout": 10,
    }
    options.update(kw)
    return PullRequestReporter(REPO, SecretStr(TOKEN), **options)  # type: ignore[arg-type]


@pytest.fixture
def reporter(fake: FakeGitHub, sleeps: Sleeps) -> PullRequestReporter:
    return make(fake, sleeps)


# ----- reading the pull request ---------------------------------------------------------------


def test_pull_request_reads_head_base_and_the_merge_base(
    fake: FakeGitHub, reporter: PullRequestReporter
) -> None:
    fake.add_pull(7, head_sha=HEAD, base_sha=BASE, merge_base=MERGE_BASE, head_ref="faster-gemm")
    pr = reporter.pull_request(7)
    assert (pr.number, pr.state, pr.author) == (7, "open", "octocat")
    assert (pr.head_sha, pr.head_ref, pr.head_repository) == (HEAD, "faster-gemm", REPO)
    assert (pr.base_sha, pr.base_ref) == (BASE, "main")
    assert pr.merge_base == MERGE_BASE  # the compare API's answer, not the base branch's tip
    assert pr.url == f"{fake.origin}/octo-org/perf/pull/7"
    assert pr.is_fork is False
    [compare] = fake.requests_to("GET", r"/repos/octo-org/perf/compare/.*")
    assert compare.path.endswith(f"/compare/{BASE}...{HEAD}")


def test_a_forced_push_moves_the_head_read(fake: FakeGitHub, reporter: PullRequestReporter) -> None:
    fake.add_pull(7, head_sha=HEAD, base_sha=BASE, merge_base=MERGE_BASE)
    assert reporter.pull_request(7).head_sha == HEAD
    fake.push(7, HEAD2)
    pr = reporter.pull_request(7)
    assert pr.head_sha == HEAD2 and pr.merge_base == MERGE_BASE


def test_fork_and_deleted_fork_pull_requests_are_forks(
    fake: FakeGitHub, reporter: PullRequestReporter
) -> None:
    fake.add_pull(3, head_sha=HEAD, base_sha=BASE, fork=True, author="mallory")
    fake.add_pull(4, head_sha=HEAD2, base_sha=BASE, fork=True, author="gone")
    fake.delete_fork(4)
    fork = reporter.pull_request(3)
    assert fork.is_fork is True and fork.head_repository == "mallory/perf"
    assert fork.author == "mallory"
    deleted = reporter.pull_request(4)
    assert deleted.is_fork is True and deleted.head_repository == ""
    assert deleted.head_sha == HEAD2


def test_an_unknown_pull_request_is_not_found(
    fake: FakeGitHub, reporter: PullRequestReporter
) -> None:
    with pytest.raises(NotFound, match="404 while reading pull request #9 in octo-org/perf"):
        reporter.pull_request(9)


# ----- the one comment ------------------------------------------------------------------------


def test_upsert_comment_twice_edits_one_comment_in_place(
    fake: FakeGitHub, reporter: PullRequestReporter
) -> None:
    fake.add_pull(7, head_sha=HEAD, base_sha=BASE)
    fake._comment(7, "LGTM, but is it slower?")  # someone else's comment, left alone
    first_id, first_url = reporter.upsert_comment(7, "## A/B: measuring")
    second_id, second_url = reporter.upsert_comment(7, "## A/B: no change")
    assert (second_id, second_url) == (first_id, first_url)
    assert first_url == f"{fake.origin}/octo-org/perf/pull/7#issuecomment-{first_id}"
    other, ours = fake.comments[7]
    assert other["body"] == "LGTM, but is it slower?"
    assert ours["id"] == first_id
    assert ours["body"] == f"{AB_MARKER}\n## A/B: no change"
    assert len(fake.requests_to("POST", COMMENTS)) == 1
    assert len(fake.requests_to("PATCH", ONE_COMMENT)) == 1


def test_upsert_comment_keeps_a_body_that_already_has_the_marker(
    fake: FakeGitHub, reporter: PullRequestReporter
) -> None:
    fake.add_pull(7, head_sha=HEAD, base_sha=BASE)
    reporter.upsert_comment(7, f"{AB_MARKER}\n## A/B")
    reporter.upsert_comment(7, f"{AB_MARKER}\n## A/B")
    [ours] = fake.comments[7]
    assert ours["body"] == f"{AB_MARKER}\n## A/B"
    assert fake.requests_to("PATCH", ONE_COMMENT) == []  # unchanged: nothing to send


def test_a_comment_that_landed_behind_a_502_is_not_created_twice(
    fake: FakeGitHub, reporter: PullRequestReporter
) -> None:
    fake.add_pull(7, head_sha=HEAD, base_sha=BASE)
    fake.fail("POST", COMMENTS, status=502, after=True)
    comment_id, _ = reporter.upsert_comment(7, "## A/B")
    [ours] = fake.comments[7]
    assert ours["id"] == comment_id
    assert len(fake.requests_to("POST", COMMENTS)) == 1


def test_a_comment_lost_to_a_502_is_created_once_on_the_resend(
    fake: FakeGitHub, reporter: PullRequestReporter, sleeps: Sleeps
) -> None:
    fake.add_pull(7, head_sha=HEAD, base_sha=BASE)
    fake.fail("POST", COMMENTS, status=502)
    reporter.upsert_comment(7, "## A/B")
    assert len(fake.comments[7]) == 1
    assert len(fake.requests_to("POST", COMMENTS)) == 2
    assert sleeps == [0.01]


def test_an_oversized_comment_is_refused_before_sending(
    fake: FakeGitHub, reporter: PullRequestReporter
) -> None:
    with pytest.raises(InvalidInput, match="GitHub takes 65536"):
        reporter.upsert_comment(7, "x" * 70_000)
    assert fake.requests == []


# ----- the commit status ----------------------------------------------------------------------


def test_set_status_lands_on_the_sha_with_the_context(
    fake: FakeGitHub, reporter: PullRequestReporter
) -> None:
    fake.add_pull(7, head_sha=HEAD, base_sha=BASE)
    reporter.set_status(HEAD, state="pending", description="nightbench A/B: measuring")
    url = f"{fake.origin}/octo-org/perf/pull/7#issuecomment-1"
    reporter.set_status(HEAD, state="failure", description="2 slower", target_url=url)
    first, second = fake.statuses[HEAD]
    assert (first["state"], first["context"], first["target_url"]) == (
        "pending",
        STATUS_CONTEXT,
        None,
    )
    assert (second["state"], second["description"], second["target_url"]) == (
        "failure",
        "2 slower",
        url,
    )
    assert second["context"] == "nightbench/ab"
    assert BASE not in fake.statuses


def test_a_long_description_is_cut_to_140_characters(
    fake: FakeGitHub, reporter: PullRequestReporter
) -> None:
    fake.add_pull(7, head_sha=HEAD, base_sha=BASE)
    reporter.set_status(HEAD, state="success", description="no change " * 30)
    [status] = fake.statuses[HEAD]
    assert len(status["description"]) == 140
    assert status["description"].endswith("…")
    assert status["description"].startswith("no change no change")


def test_a_bad_state_or_sha_is_refused_before_sending(
    fake: FakeGitHub, reporter: PullRequestReporter
) -> None:
    with pytest.raises(InvalidInput, match="state must be one of"):
        reporter.set_status(HEAD, state="passed", description="x")
    with pytest.raises(InvalidInput, match="full commit sha"):
        reporter.set_status("../../issues", state="success", description="x")
    assert fake.requests == []


def test_a_status_refused_by_a_502_is_resent(
    fake: FakeGitHub, reporter: PullRequestReporter
) -> None:
    fake.add_pull(7, head_sha=HEAD, base_sha=BASE)
    fake.fail("POST", r"/repos/octo-org/perf/statuses/.*", status=502)
    reporter.set_status(HEAD, state="success", description="no change")
    assert [s["state"] for s in fake.statuses[HEAD]] == ["success"]


# ----- permissions ----------------------------------------------------------------------------


def test_permission_of_a_collaborator_and_of_a_stranger(
    fake: FakeGitHub, reporter: PullRequestReporter
) -> None:
    fake.set_permission("alice", "write")
    fake.set_permission("mia", "maintain")
    assert reporter.permission("alice") == "write"
    assert reporter.permission("mia") == "write"  # the legacy base role
    assert reporter.permission("stranger") == "none"
    with pytest.raises(InvalidInput, match="login"):
        reporter.permission("")


# ----- failures -------------------------------------------------------------------------------


def test_a_bad_token_names_the_setting(fake: FakeGitHub, sleeps: Sleeps) -> None:
    fake.add_pull(7, head_sha=HEAD, base_sha=BASE)
    fake.token = "ghp_rotated_not_ours"
    reporter = make(fake, sleeps)
    with pytest.raises(TrackerAccessDenied, match="NIGHTBENCH_GITHUB_TOKEN") as caught:
        reporter.upsert_comment(7, "## A/B")
    assert "401" in str(caught.value) and TOKEN not in str(caught.value)
    assert fake.comments[7] == []


def test_a_403_names_the_access_the_token_lacks(
    fake: FakeGitHub, reporter: PullRequestReporter
) -> None:
    fake.add_pull(7, head_sha=HEAD, base_sha=BASE)
    fake.fail("POST", r"/repos/octo-org/perf/statuses/.*", status=403, message="Forbidden")
    with pytest.raises(TrackerAccessDenied, match="commit status write access"):
        reporter.set_status(HEAD, state="success", description="x")


def test_an_unknown_repository_names_the_setting(fake: FakeGitHub, sleeps: Sleeps) -> None:
    reporter = PullRequestReporter(
        "octo-org/nope", TOKEN, api_url=fake.base_url, seconds_between_requests=None
    )
    with pytest.raises(TrackerAccessDenied, match="octo-org/nope.*NIGHTBENCH_GITHUB_REPOSITORY"):
        reporter.pull_request(7)


def test_a_5xx_storm_is_an_infrastructure_error(fake: FakeGitHub, sleeps: Sleeps) -> None:
    fake.add_pull(7, head_sha=HEAD, base_sha=BASE)
    reporter = make(fake, sleeps)
    fake.fail("*", r"/repos/octo-org/perf.*", status=503, times=100)
    with pytest.raises(InfrastructureError, match="while reading pull request #7") as caught:
        reporter.pull_request(7)
    assert not isinstance(caught.value, TrackerAccessDenied)
    fake.heal()
    fake.fail("POST", COMMENTS, status=502, times=100)
    with pytest.raises(InfrastructureError, match="502 while commenting on pull request #7"):
        reporter.upsert_comment(7, "## A/B")
    assert len(fake.requests_to("POST", COMMENTS)) == 3  # write_attempts
    assert fake.comments[7] == []


def test_constructor_rejects_bad_configuration() -> None:
    with pytest.raises(InvalidInput, match="owner/name"):
        PullRequestReporter("perf", TOKEN)
    with pytest.raises(InvalidInput, match="token is empty"):
        PullRequestReporter(REPO, SecretStr(""))
    assert TOKEN not in repr(PullRequestReporter(REPO, TOKEN))
