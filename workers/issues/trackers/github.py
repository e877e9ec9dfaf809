"""Issues in a GitHub (or GitHub Enterprise Server) repository, through PyGithub.

:class:`GitHubTracker` satisfies :class:`~workers.issues.trackers.IssueTracker`. Its
:meth:`~GitHubTracker.create` looks for an open issue carrying the fingerprint marker before
creating one, and again after a failed create before trying anew, so a crash or a lost response
between "GitHub created the issue" and "we recorded its number" never yields a second issue.

Retries: reads and idempotent writes (GET, PATCH, PUT, DELETE) go through PyGithub's own
``GithubRetry`` (urllib3 ``Retry``): exponential backoff on 5xx and connection errors, waiting
out rate limits (403/429 with ``Retry-After`` or ``X-RateLimit-Reset``). POSTs (create issue,
comment, add labels) are repeated by urllib3 only after a rate-limit rejection, which GitHub
answers before acting; after a 5xx or a dropped connection a POST may have landed, so
:class:`GitHubTracker` first checks whether it did, then resends with backoff.

The token lives only inside PyGithub's ``Auth.Token`` (which masks it in PyGithub's own debug
logs); nothing here logs it, puts it in an error message or in ``repr``.

What any PyGithub client of nightbench needs is public here, so a second one shares it rather
than copies it (:mod:`workers.ab.github` reports pull-request A/Bs with it):
:func:`check_target` and :func:`make_github_client` build the client, :func:`open_repository`
reads the repository, :func:`github_errors` maps failures to nightbench errors, and
:func:`send_unless_landed` is the resend loop for writes that may have landed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import github
import requests
from github.GithubException import (
    BadCredentialsException,
    GithubException,
    RateLimitExceededExceedsMaxWait,
    RateLimitExceededException,
    UnknownObjectException,
)
from github.GithubRetry import GithubRetry
from pydantic import SecretStr
from urllib3 import Retry

from service.errors import InfrastructureError, InvalidInput, NotFound, TrackerAccessDenied
from workers.issues.model import RenderedIssue, TrackedIssue
from workers.issues.trackers.markers import (
    check_key,
    comment_marker,
    find_fingerprint,
    find_run_id,
    with_comment_marker,
)

if TYPE_CHECKING:
    from github.Issue import Issue
    from github.Repository import Repository

log = logging.getLogger(__name__)

T = TypeVar("T")

# urllib3's defaults plus PATCH: editing an issue twice leaves it as editing it once.
_IDEMPOTENT_METHODS = frozenset({"DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "PUT", "TRACE"})
_RATE_LIMITED = frozenset({403, 429})


class _Retry(GithubRetry):
    """PyGithub's ``GithubRetry`` with two additions.

    * A 429 waits until ``X-RateLimit-Reset`` (GitHub answers primary and secondary limits with
      403 or 429; ``GithubRetry`` inspects only 403s, urllib3 honours only ``Retry-After``).
    * A POST is repeated after a rate-limit rejection, which GitHub answers before acting, but
      not after a 5xx or a read error, after which it may have landed.
    """

    def is_retry(self, method: str, status_code: int, has_retry_after: bool = False) -> bool:
        if method == "POST" and status_code in _RATE_LIMITED:
            return True
        return super().is_retry(method, status_code, has_retry_after)

    def increment(  # type: ignore[override]
        self,
        method: str | None = None,
        url: str | None = None,
        response: Any = None,
        error: Exception | None = None,
        _pool: Any = None,
        _stacktrace: Any = None,
    ) -> Retry:
        retry = super().increment(method, url, response, error, _pool, _stacktrace)
        if response is None or response.status != 429:
            return retry
        wait = _rate_limit_wait(response.headers, default=self.secondary_rate_wait)
        if self.max_rate_limit_wait is not None and wait > self.max_rate_limit_wait:
            raise RateLimitExceededExceedsMaxWait(
                429, {"message": "rate limited"}, dict(response.headers), wait=wait
            )
        if "Retry-After" not in response.headers:
            floor = retry.get_backoff_time()
            retry.get_backoff_time = lambda: max(wait, floor)  # type: ignore[method-assign]
        log.info("GitHub rate limit hit on %s; waiting %.0f s", method, wait)
        return retry


def _rate_limit_wait(headers: Any, *, default: float) -> float:
    """Seconds to wait after a rate-limited response, as GitHub's REST docs ask.

    ``Retry-After`` if present; else until ``X-RateLimit-Reset`` (plus one second, since the
    header has whole seconds) when ``X-RateLimit-Remaining`` is 0; else ``default``.
    """
    retry_after = headers.get("Retry-After")
    if retry_after and retry_after.strip().isdigit():
        return float(retry_after)
    reset = headers.get("X-RateLimit-Reset")
    if headers.get("X-RateLimit-Remaining") == "0" and reset and reset.strip().isdigit():
        return max(int(reset) - time.time(), 0.0) + 1.0
    return default


def check_target(repository: str, token: str | SecretStr, *, write_attempts: int) -> str:
    """Check a client's settings before anything is sent.

    Args:
        repository: ``"owner/name"``.
        token: the GitHub token.
        write_attempts: how many times the client will send one POST in all.

    Returns:
        The token as a plain string, for :func:`make_github_client` only (never log it).

    Raises:
        InvalidInput: ``repository`` is not ``owner/name``, ``token`` is empty or
            ``write_attempts`` is below 1.
    """
    if repository.count("/") != 1 or not all(repository.split("/")):
        raise InvalidInput(f'GitHub repository must look like "owner/name", got {repository!r}')
    secret = token.get_secret_value() if isinstance(token, SecretStr) else token
    if not secret:
        raise InvalidInput("GitHub token is empty")
    if write_attempts < 1:
        raise InvalidInput(f"write_attempts must be at least 1, got {write_attempts}")
    return secret


def make_github_client(
    api_url: str,
    secret: str,
    *,
    retries: int,
    backoff_factor: float,
    max_rate_limit_wait: float,
    secondary_rate_wait: float,
    seconds_between_requests: float | None,
    seconds_between_writes: float | None,
    timeout: int,
) -> github.Github:
    """A PyGithub client with nightbench's retries (see the module docstring).

    Args:
        api_url: the REST API base URL, without a trailing slash.
        secret: the token, as :func:`check_target` returned it.
        retries: urllib3 retries per request (5xx, connection errors, rate limits).
        backoff_factor: urllib3 backoff in seconds (``factor * 2 ** (n - 1)``).
        max_rate_limit_wait: longest rate-limit wait in seconds before giving up.
        secondary_rate_wait: wait in seconds for a secondary limit that names no reset.
        seconds_between_requests: PyGithub's throttle between any two requests.
        seconds_between_writes: PyGithub's throttle between two writes.
        timeout: per request, in seconds.

    Returns:
        The client; it sends nothing until asked.
    """
    retry = _Retry(
        total=retries,
        backoff_factor=backoff_factor,
        status_forcelist=[*range(500, 600), 429],
        allowed_methods=_IDEMPOTENT_METHODS,
        secondary_rate_wait=secondary_rate_wait,
        max_rate_limit_wait=max_rate_limit_wait,
    )
    return github.Github(
        base_url=api_url,
        auth=github.Auth.Token(secret),
        retry=retry,
        timeout=timeout,
        per_page=100,
        seconds_between_requests=seconds_between_requests,
        seconds_between_writes=seconds_between_writes,
    )


def open_repository(client: github.Github, repository: str, api_url: str) -> Repository:
    """Read ``repository`` through ``client`` (one GET).

    Raises:
        TrackerAccessDenied: GitHub answered 404 (no such repository, or the token cannot see
            it), naming the settings to check.
        github.GithubException, requests.RequestException: any other failure, for
            :func:`github_errors` to map.
    """
    try:
        return client.get_repo(repository)
    except UnknownObjectException as exc:
        raise TrackerAccessDenied(
            f"GitHub answered 404 for the repository {repository} at {api_url}: check "
            "NIGHTBENCH_GITHUB_REPOSITORY, or that NIGHTBENCH_GITHUB_TOKEN can see it"
        ) from exc


def send_unless_landed(
    action: str,
    send: Callable[[], T],
    landed: Callable[[], Any],
    *,
    attempts: int,
    backoff: float,
    sleep: Callable[[float], None],
) -> T | Any:
    """Send a POST; after a failure that may have landed, check ``landed()`` before resending.

    Args:
        action: what is being done, for the log (``"creating an issue"``).
        send: sends the POST once.
        landed: what a landed POST left (the issue, the comment), or ``None`` if nothing.
        attempts: how many times ``send`` is called in all.
        backoff: the first wait in seconds between sends; it doubles after each.
        sleep: how to wait.

    Returns:
        What ``send`` returned, or what ``landed`` found.

    Raises:
        github.GithubException, requests.RequestException: a failure after which the POST
            cannot have landed (a 4xx), or the last attempt's failure.
    """
    delay = backoff
    for attempt in range(1, attempts + 1):
        try:
            return send()
        except (GithubException, requests.RequestException) as exc:
            if not _maybe_landed(exc) or attempt == attempts:
                raise
            log.warning(
                "GitHub failed while %s (%s, attempt %d of %d); checking whether it landed",
                action,
                _describe(exc),
                attempt,
                attempts,
            )
        found = landed()
        if found is not None:
            log.info("the failed attempt at %s had landed; not sending again", action)
            return found
        sleep(delay)
        delay *= 2
    raise AssertionError("unreachable: the loop returns or raises")


@contextmanager
def github_errors(
    action: str,
    where: str,
    *,
    subject: str = "issue",
    access: str = "issue write access",
) -> Iterator[None]:
    """Turn PyGithub and requests failures into nightbench errors that name the action.

    Args:
        action: what was being done (``"filing an issue"``).
        where: ``"owner/name at API-URL"``.
        subject: what a 404 may mean is missing besides the repository (``"pull request"``).
        access: what a 403 says the token needs on the repository (``"issue write access"``).

    Raises:
        NotFound: a 404.
        TrackerAccessDenied: a 401 (bad token) or a 403 other than a rate limit.
        InfrastructureError: a rate limit longer than allowed, another HTTP error, retries
            exhausted, or GitHub unreachable.
    """
    try:
        yield
    except UnknownObjectException as exc:
        raise NotFound(
            f"GitHub answered 404 while {action} in {where}: the repository or {subject} does "
            "not exist, or the token cannot see it"
        ) from exc
    except BadCredentialsException as exc:
        raise TrackerAccessDenied(
            f"GitHub rejected the token (401) while {action} in {where}: set "
            "NIGHTBENCH_GITHUB_TOKEN to a valid token"
        ) from exc
    except (RateLimitExceededException, RateLimitExceededExceedsMaxWait) as exc:
        reset = exc.headers.get("X-RateLimit-Reset") if exc.headers else None
        raise InfrastructureError(
            f"GitHub rate limit while {action} in {where}; it resets at {_reset_text(reset)}"
        ) from exc
    except GithubException as exc:
        data = exc.data if isinstance(exc.data, dict) else {}
        message = exc.message or data.get("message") or "no message"
        if exc.status == 403:
            raise TrackerAccessDenied(
                f"GitHub refused (403) {action} in {where}: {message}; give "
                f"NIGHTBENCH_GITHUB_TOKEN {access} to NIGHTBENCH_GITHUB_REPOSITORY"
            ) from exc
        raise InfrastructureError(
            f"GitHub answered {exc.status} while {action} in {where}: {message}"
        ) from exc
    except requests.exceptions.RetryError as exc:
        raise InfrastructureError(
            f"GitHub kept answering 5xx while {action} in {where} (retries exhausted)"
        ) from exc
    except requests.RequestException as exc:
        raise InfrastructureError(
            f"could not reach GitHub while {action} in {where}: {type(exc).__name__}"
        ) from exc


def _maybe_landed(exc: BaseException) -> bool:
    """True for a failed write that GitHub may still have carried out (5xx, lost connection)."""
    if isinstance(exc, GithubException):
        return exc.status >= 500
    return isinstance(
        exc, requests.ConnectionError | requests.Timeout | requests.exceptions.RetryError
    )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, GithubException):
        return f"HTTP {exc.status}"
    return type(exc).__name__


class GitHubRepositoryClient:
    """One GitHub (or GitHub Enterprise Server) repository through PyGithub: the client with
    its retries and throttle, the repository opened once, and the resend loop for writes whose
    answer was lost. The issue tracker and the pull request reporter are both one.

    Args:
        repository: ``"owner/name"``.
        token: a token with the access the subclass needs.
        api_url: the REST API base URL: ``https://api.github.com``, or
            ``https://HOST/api/v3`` for GitHub Enterprise Server.
        retries: urllib3 retries per request (5xx, connection errors, rate limits).
        backoff_factor: urllib3 backoff in seconds (``factor * 2 ** (n - 1)``), and the first
            wait of the resend loop for writes that may have landed.
        write_attempts: how many times a POST is sent in all.
        max_rate_limit_wait: longest rate-limit wait in seconds before giving up.
        secondary_rate_wait: wait in seconds for a secondary limit that names no reset.
        seconds_between_requests: PyGithub's throttle between requests (s).
        seconds_between_writes: PyGithub's throttle between writes (s; GitHub asks for a
            second between writes to stay clear of secondary limits).
        timeout: per request, in seconds.
        sleep: how the resend loop waits (tests pass a recorder).

    Raises:
        InvalidInput: ``repository`` is not ``owner/name`` or ``token`` is empty.
    """

    def __init__(
        self,
        repository: str,
        token: str | SecretStr,
        *,
        api_url: str = "https://api.github.com",
        retries: int = 6,
        backoff_factor: float = 2.0,
        write_attempts: int = 4,
        max_rate_limit_wait: float = 3600.0,
        secondary_rate_wait: float = 60.0,
        seconds_between_requests: float | None = 0.25,
        seconds_between_writes: float | None = 1.0,
        timeout: int = 15,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        secret = check_target(repository, token, write_attempts=write_attempts)
        self.repository = repository
        self.api_url = api_url.rstrip("/")
        self._backoff = backoff_factor
        self._write_attempts = write_attempts
        self._sleep = sleep
        self._github = make_github_client(
            self.api_url,
            secret,
            retries=retries,
            backoff_factor=backoff_factor,
            max_rate_limit_wait=max_rate_limit_wait,
            secondary_rate_wait=secondary_rate_wait,
            seconds_between_requests=seconds_between_requests,
            seconds_between_writes=seconds_between_writes,
            timeout=timeout,
        )
        self._repo: Repository | None = None

    def _repository(self) -> Repository:
        if self._repo is None:
            self._repo = open_repository(self._github, self.repository, self.api_url)
        return self._repo

    def _write(self, action: str, send: Callable[[], T], landed: Callable[[], Any]) -> T | Any:
        """:func:`send_unless_landed` with this client's attempts, backoff and sleep."""
        return send_unless_landed(
            action,
            send,
            landed,
            attempts=self._write_attempts,
            backoff=self._backoff,
            sleep=self._sleep,
        )


class GitHubTracker(GitHubRepositoryClient):
    """Issues in a GitHub (or GitHub Enterprise Server) repository, through PyGithub.

    Args:
        repository: ``"owner/name"``.
        token: a token allowed to write issues of ``repository``.
        api_url: the REST API base URL: ``https://api.github.com``, or
            ``https://HOST/api/v3`` for GitHub Enterprise Server.
        search_label: a label every filed issue carries; marker lookups and sync list only
            issues with it (``None``: all issues), which keeps them to a page or two on busy
            repositories. The list endpoint is used rather than the search API because search
            lags new issues by up to a minute, which would defeat the look-before-create.
        **options: :class:`GitHubRepositoryClient`'s (retries, backoff, throttle, timeout,
            write attempts, sleep).

    Raises:
        InvalidInput: ``repository`` is not ``owner/name`` or ``token`` is empty.
    """

    def __init__(
        self,
        repository: str,
        token: str | SecretStr,
        *,
        api_url: str = "https://api.github.com",
        search_label: str | None = "performance",
        **options: Any,
    ) -> None:
        super().__init__(repository, token, api_url=api_url, **options)
        self.search_label = search_label

    kind = "github"

    def __repr__(self) -> str:
        return f"GitHubTracker(repository={self.repository!r}, api_url={self.api_url!r})"

    @property
    def location(self) -> str:
        """``owner/name@api-url``."""
        return f"{self.repository}@{self.api_url}"

    # ----- IssueTracker ---------------------------------------------------------------------

    def find_open(self, fingerprint: str) -> TrackedIssue | None:
        """The open issue whose body carries ``fingerprint``'s marker, newest first, or ``None``.

        Raises:
            InfrastructureError: GitHub could not be reached or kept failing.
            NotFound: the repository does not exist or the token cannot see it.
        """
        with self._errors("looking for an open issue"):
            return self._find_open(fingerprint)

    def create(self, issue: RenderedIssue) -> TrackedIssue:
        """File ``issue``; return the open issue already carrying its fingerprint if there is one.

        Raises:
            InfrastructureError: GitHub kept failing (after ``write_attempts`` sends).
            NotFound: the repository does not exist or the token cannot see it.
        """
        with self._errors("filing an issue"):
            existing = self._find_open(issue.fingerprint)
            if existing is not None:
                log.info("issue #%d carries fingerprint %s", existing.number, issue.fingerprint)
                return existing
            repo = self._repository()
            created = self._write(
                "creating an issue",
                lambda: _tracked(
                    repo.create_issue(title=issue.title, body=issue.body, labels=list(issue.labels))
                ),
                lambda: self._find_open(issue.fingerprint),
            )
            log.info("filed issue #%d in %s: %s", created.number, self.repository, created.url)
            if self.search_label and self.search_label not in created.labels:
                # GitHub drops labels silently for tokens without triage rights; the marker
                # lookup lists only labelled issues, so the next filing would not see this one.
                log.warning(
                    "issue #%d was filed without the label %r (does the token have triage "
                    "access?); later filings will not find it to comment on",
                    created.number,
                    self.search_label,
                )
            return created

    def comment(self, number: int, body: str, *, key: str) -> None:
        """Comment on issue ``number`` unless a comment with ``key`` is already there.

        Args:
            number: the issue.
            body: Markdown.
            key: identifies this comment (``"run-42"``): a second call with it does nothing.

        Raises:
            InvalidInput: ``key`` has characters outside letters, digits and ``_.:-``.
            NotFound: no issue ``number``.
            InfrastructureError: GitHub kept failing.
        """
        text = with_comment_marker(body, check_key(key))
        with self._errors(f"commenting on issue #{number}"):
            target = self._repository().get_issue(number)
            mark = comment_marker(key)

            def landed() -> bool | None:
                return True if any(mark in (c.body or "") for c in target.get_comments()) else None

            if landed():
                log.info("issue #%d already has comment %s", number, key)
                return
            self._write(
                f"commenting on issue #{number}", lambda: target.create_comment(text), landed
            )

    def add_labels(self, number: int, labels: Sequence[str]) -> None:
        """Add ``labels`` to issue ``number``.

        Raises:
            NotFound: no issue ``number``.
            InfrastructureError: GitHub kept failing.
        """
        wanted = [name for name in dict.fromkeys(labels) if name]
        if not wanted:
            return
        with self._errors(f"labelling issue #{number}"):
            target = self._repository().get_issue(number)

            def landed() -> bool | None:
                names = {lb.name for lb in self._repository().get_issue(number).labels}
                return True if set(wanted) <= names else None

            self._write(f"labelling issue #{number}", lambda: target.add_to_labels(*wanted), landed)

    def get(self, number: int) -> TrackedIssue:
        """Issue ``number``.

        Raises:
            NotFound: no issue ``number`` in the repository.
            InfrastructureError: GitHub kept failing.
        """
        with self._errors(f"reading issue #{number}"):
            return _tracked(self._repository().get_issue(number))

    def updated_since(self, since: datetime | None) -> list[TrackedIssue]:
        """Issues with a fingerprint marker (open and closed) updated at or after ``since``.

        Args:
            since: timezone-aware; ``None`` lists them all.

        Returns:
            Oldest change first.

        Raises:
            InvalidInput: ``since`` is naive.
            InfrastructureError: GitHub kept failing.
        """
        params: dict[str, Any] = {"state": "all", "sort": "updated", "direction": "asc"}
        if since is not None:
            if since.tzinfo is None:
                raise InvalidInput("since must be timezone-aware")
            # PyGithub formats it with strftime(...Z), so it must already be in UTC.
            params["since"] = since.astimezone(UTC)
        if self.search_label:
            params["labels"] = [self.search_label]
        with self._errors("listing updated issues"):
            found = []
            for item in self._repository().get_issues(**params):
                if _is_pull_request(item):
                    continue
                tracked = _tracked(item)
                if tracked.fingerprint is not None:
                    found.append(tracked)
            return found

    # ----- internals -------------------------------------------------------------------------

    def _find_open(self, fingerprint: str) -> TrackedIssue | None:
        params: dict[str, Any] = {"state": "open", "sort": "created", "direction": "desc"}
        if self.search_label:
            params["labels"] = [self.search_label]
        for item in self._repository().get_issues(**params):
            if not _is_pull_request(item) and find_fingerprint(item.body) == fingerprint:
                return _tracked(item)
        return None

    def _errors(self, action: str) -> AbstractContextManager[None]:
        """:func:`github_errors` for this tracker's repository."""
        return github_errors(action, f"{self.repository} at {self.api_url}")


def _reset_text(reset: str | None) -> str:
    if reset and reset.isdigit():
        return datetime.fromtimestamp(int(reset), UTC).isoformat()
    return "an unknown time"


def _is_pull_request(item: Issue) -> bool:
    # ``item.pull_request`` is absent on plain issues and PyGithub would fetch the issue again
    # to complete it; the html_url tells the two apart without a request.
    return "/pull/" in (item.html_url or "")


def _tracked(item: Issue) -> TrackedIssue:
    updated = item.updated_at
    if updated.tzinfo is None:
        updated = updated.replace(tzinfo=UTC)
    return TrackedIssue(
        number=item.number,
        url=item.html_url,
        title=item.title,
        state=item.state,
        labels=tuple(label.name for label in item.labels),
        fingerprint=find_fingerprint(item.body),
        updated_at=updated,
        state_reason=item.state_reason,
        run_id=find_run_id(item.body),
    )
