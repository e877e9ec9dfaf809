"""A local stand-in for GitHub's REST API, enough for what nightbench asks of PyGithub.

It answers with GitHub's response shapes (issues, comments, labels, repository, pull requests,
compare, commits, commit statuses, collaborator permissions, rate-limit headers, ``Link``
pagination) on ``127.0.0.1`` at an ephemeral port, under a GitHub Enterprise
style prefix (``/api/v3``) so the configurable base URL is exercised. Tests can inject failures
(a 502, a failure after the write landed, a primary or secondary rate limit with reset headers)
and read back every request it received.

Served (``{p}`` = ``/repos/{owner}/{repo}``)::

    GET   {p}                         GET   {p}/issues?state&labels&since&sort&direction&page
    POST  {p}/issues                  GET   {p}/issues/{n}          PATCH {p}/issues/{n}
    GET   {p}/issues/{n}/comments     POST  {p}/issues/{n}/comments
    GET   {p}/issues/{n}/labels       POST  {p}/issues/{n}/labels   DELETE {p}/issues/{n}/labels/{l}
    GET   {p}/issues/comments/{id}    PATCH {p}/issues/comments/{id}
    GET   {p}/pulls/{n}               GET   {p}/compare/{base}...{head}
    GET   {p}/commits/{sha}           GET   {p}/commits/{sha}/statuses (newest first)
    POST  {p}/statuses/{sha}          GET   {p}/collaborators/{login}/permission
    GET   /rate_limit

A pull request is also an issue (:meth:`FakeGitHub.add_pull`): its number is an issue number,
its issue JSON has a ``pull_request`` key and an ``html_url`` under ``/pull/``, and its
conversation comments are issue comments, as on GitHub. Commits are known by sha only (those
of the pull requests): an unknown sha is answered 422 ``No commit found for SHA``, as GitHub
does.
"""

from __future__ import annotations

import json
import re
import threading
import time
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

_RATE_LIMIT = 5000
_DOCS = "https://docs.github.com/rest"


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server received it (``at``: ``time.time()`` on arrival)."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any
    at: float


@dataclass
class Fault:
    """An injected answer for requests matching ``method`` and the regex ``path``.

    ``after=True`` performs the request first, then answers with the fault (the write landed but
    the client saw a failure, as when a gateway times out behind GitHub). ``method="*"`` matches
    every method; ``then`` are faults that start once this one has answered (an outage that
    begins right after a write landed). ``delay`` holds the answer back that many seconds (a
    client with a shorter timeout sees a timeout).
    """

    method: str
    path: str
    status: int
    times: int = 1
    after: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)
    then: tuple[Fault, ...] = ()
    delay: float = 0.0

    def matches(self, method: str, path: str) -> bool:
        if self.times <= 0 or self.method not in ("*", method):
            return False
        return re.fullmatch(self.path, path) is not None


class FakeGitHub:
    """GitHub's REST API for one repository, in a thread.

    Args:
        owner, repo: the repository served.
        token: the token requests must carry (``Authorization: token ...`` or ``Bearer``);
            ``None`` accepts anonymous requests.
        prefix: URL path prefix of the API (``/api/v3`` as on GitHub Enterprise Server).
        per_page_max: largest page the server returns, like GitHub's 100.
    """

    def __init__(
        self,
        owner: str = "octo-org",
        repo: str = "perf",
        *,
        token: str | None = "ghp_test_token_not_secret",
        prefix: str = "/api/v3",
        per_page_max: int = 100,
    ) -> None:
        self.owner, self.repo, self.token = owner, repo, token
        self.prefix = prefix.rstrip("/")
        self.per_page_max = per_page_max
        self.issues: dict[int, dict[str, Any]] = {}
        self.comments: dict[int, list[dict[str, Any]]] = {}
        self.pulls: dict[int, dict[str, Any]] = {}
        self.statuses: dict[str, list[dict[str, Any]]] = {}
        self.permissions: dict[str, str] = {}
        self.shas: set[str] = set()
        self.requests: list[RecordedRequest] = []
        self.faults: list[Fault] = []
        self._lock = threading.RLock()
        self._next_id = 1000
        self._remaining = _RATE_LIMIT
        self._server: ThreadingHTTPServer | None = None
        self._port = 0
        self._thread: threading.Thread | None = None

    # ----- lifecycle -------------------------------------------------------------------------

    def start(self, port: int = 0) -> FakeGitHub:
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self._port = int(self._server.server_address[1])
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def restart(self) -> None:
        """Serve again on the port it had before :meth:`stop` (the end of an outage)."""
        self.start(self._port)

    def __enter__(self) -> FakeGitHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def origin(self) -> str:
        if self._server is None:
            raise RuntimeError("the fake GitHub server is not running")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def base_url(self) -> str:
        """The API base URL to hand to ``github.Github(base_url=...)``."""
        return self.origin + self.prefix

    @property
    def repo_path(self) -> str:
        return f"/repos/{self.owner}/{self.repo}"

    # ----- test controls ---------------------------------------------------------------------

    def fail(
        self,
        method: str,
        path: str,
        *,
        status: int = 502,
        times: int = 1,
        after: bool = False,
        headers: dict[str, str] | None = None,
        message: str = "Server Error",
        then: tuple[Fault, ...] = (),
        delay: float = 0.0,
    ) -> None:
        """Answer the next ``times`` matching requests with ``status``.

        Args:
            method: HTTP method.
            path: regex over the path without prefix, e.g. ``r"/repos/o/r/issues"``.
            status: status to answer with.
            times: how many requests the fault applies to.
            after: carry out the request before answering with the failure.
            headers: extra response headers.
            message: the JSON body's ``message``.
            then: faults that start once this one has answered.
            delay: seconds to hold the answer back (past the client's timeout: a timeout).
        """
        with self._lock:
            self.faults.append(
                Fault(
                    method,
                    path,
                    status,
                    times,
                    after,
                    dict(headers or {}),
                    {"message": message},
                    then,
                    delay,
                )
            )

    def heal(self) -> None:
        """Drop every injected fault still waiting: GitHub answers normally again."""
        with self._lock:
            self.faults.clear()

    def rate_limit(
        self,
        method: str,
        path: str,
        *,
        status: int = 403,
        reset_in: float = 1.0,
        retry_after: int | None = None,
        secondary: bool = False,
        times: int = 1,
    ) -> int:
        """Answer the next matching requests as GitHub does when a rate limit is hit.

        Args:
            method, path: which requests (``path`` is a regex).
            status: 403 or 429; GitHub uses both.
            reset_in: seconds from now to the ``X-RateLimit-Reset`` it announces.
            retry_after: a ``Retry-After`` header in seconds, as for secondary limits.
            secondary: the secondary-limit message instead of the primary one.
            times: how many requests the fault applies to.

        Returns:
            The announced reset as a UNIX time (whole seconds, like GitHub's header).
        """
        reset = int(time.time() + reset_in + 0.999)
        headers = {
            "X-RateLimit-Limit": str(_RATE_LIMIT),
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Reset": str(reset),
            "X-RateLimit-Used": str(_RATE_LIMIT),
            "X-RateLimit-Resource": "core",
        }
        if retry_after is not None:
            headers["Retry-After"] = str(retry_after)
        message = (
            "You have exceeded a secondary rate limit. "
            "Please wait a few minutes before you try again."
            if secondary
            else "API rate limit exceeded for user ID 1."
        )
        with self._lock:
            self.faults.append(
                Fault(
                    method,
                    path,
                    status,
                    times,
                    False,
                    headers,
                    {"message": message, "documentation_url": _DOCS},
                )
            )
        return reset

    def requests_to(self, method: str, path: str) -> list[RecordedRequest]:
        """Recorded requests with this method whose path (without prefix) matches the regex."""
        with self._lock:
            return [r for r in self.requests if r.method == method and re.fullmatch(path, r.path)]

    def close_issue(self, number: int, *, reason: str = "completed") -> None:
        """Close an issue as a maintainer would (``reason``: completed | not_planned)."""
        with self._lock:
            self._edit(number, {"state": "closed", "state_reason": reason})

    def reopen_issue(self, number: int) -> None:
        with self._lock:
            self._edit(number, {"state": "open", "state_reason": "reopened"})

    def label_issue(self, number: int, *names: str) -> None:
        with self._lock:
            self._add_labels(number, list(names))

    def add_pull(
        self,
        number: int,
        *,
        head_sha: str,
        base_sha: str,
        merge_base: str | None = None,
        head_ref: str = "feature",
        fork: bool = False,
        title: str = "Make it faster",
        author: str = "octocat",
        base_ref: str = "main",
    ) -> dict[str, Any]:
        """Open pull request ``number`` (also issue ``number``, as on GitHub).

        Args:
            number: the PR's number; no issue may have it yet.
            head_sha, base_sha: the PR's head and its base branch's tip.
            merge_base: what the compare API answers as the merge base (``base_sha`` if unset).
            head_ref, base_ref: branch names.
            fork: the head lives in ``{author}/{repo}`` rather than this repository.
            title, author: the PR's title and its author's login.

        Returns:
            The stored pull request (what is served is built from it on each request).
        """
        with self._lock:
            if number in self.issues:
                raise ValueError(f"issue #{number} exists already")
            issue = self._create_issue({"title": title, "body": "The PR's description."})
            if issue["number"] != number:
                # _create_issue numbers after the highest; move it to the number asked for.
                del self.issues[issue["number"]], self.comments[issue["number"]]
                issue["number"] = number
                self.issues[number], self.comments[number] = issue, []
            api = f"{self.base_url}{self.repo_path}"
            html = f"{self.origin}/{self.owner}/{self.repo}/pull/{number}"
            issue.update(
                url=f"{api}/issues/{number}",
                comments_url=f"{api}/issues/{number}/comments",
                html_url=html,
                user=self._user(author),
                pull_request={
                    "url": f"{api}/pulls/{number}",
                    "html_url": html,
                    "diff_url": f"{html}.diff",
                    "patch_url": f"{html}.patch",
                    "merged_at": None,
                },
            )
            head_repo = f"{author}/{self.repo}" if fork else f"{self.owner}/{self.repo}"
            pull = {
                "number": number,
                "head_sha": head_sha,
                "head_ref": head_ref,
                "head_repo": head_repo,
                "base_sha": base_sha,
                "base_ref": base_ref,
                "merge_base": merge_base or base_sha,
            }
            self.pulls[number] = pull
            self.shas.update({head_sha, base_sha, pull["merge_base"]})
            return pull

    def push(self, number: int, head_sha: str) -> None:
        """Force-push pull request ``number``'s branch: its head moves to ``head_sha``."""
        with self._lock:
            pull = self.pulls[number]
            pull["head_sha"] = head_sha
            self.shas.add(head_sha)
            self.issues[number]["updated_at"] = _now()

    def delete_fork(self, number: int) -> None:
        """Delete pull request ``number``'s fork: GitHub then serves ``head.repo: null``."""
        with self._lock:
            self.pulls[number]["head_repo"] = None

    def set_permission(self, login: str, permission: str) -> None:
        """Make ``login`` a collaborator with the role ``permission``.

        ``permission`` is a role (admin | maintain | write | triage | read); the endpoint answers
        it as ``role_name`` and its legacy base role as ``permission``, as GitHub does.
        """
        with self._lock:
            self.permissions[login] = permission

    # ----- state -----------------------------------------------------------------------------

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _user(self, login: str = "nightbench-bot") -> dict[str, Any]:
        number = 1 if login == "nightbench-bot" else zlib.crc32(login.encode())
        return {
            "login": login,
            "id": number,
            "node_id": f"U_{number}",
            "type": "User",
            "site_admin": False,
            "url": f"{self.base_url}/users/{login}",
            "html_url": f"{self.origin}/{login}",
        }

    def _label(self, name: str) -> dict[str, Any]:
        return {
            "id": zlib.crc32(name.encode()),
            "node_id": f"LA_{name}",
            "url": f"{self.base_url}{self.repo_path}/labels/{name}",
            "name": name,
            "color": "ededed",
            "default": False,
            "description": None,
        }

    def _repository(self) -> dict[str, Any]:
        return {
            "id": 1,
            "node_id": "R_1",
            "name": self.repo,
            "full_name": f"{self.owner}/{self.repo}",
            "owner": {**self._user(), "login": self.owner, "type": "Organization"},
            "private": False,
            "html_url": f"{self.origin}/{self.owner}/{self.repo}",
            "url": f"{self.base_url}{self.repo_path}",
            "issues_url": f"{self.base_url}{self.repo_path}/issues{{/number}}",
            "has_issues": True,
            "default_branch": "main",
            "open_issues_count": sum(1 for i in self.issues.values() if i["state"] == "open"),
            "fork": False,
        }

    def _fork(self, full_name: str) -> dict[str, Any]:
        owner, name = full_name.split("/")
        url = f"{self.base_url}/repos/{full_name}"
        return {
            "id": zlib.crc32(full_name.encode()),
            "node_id": f"R_{full_name}",
            "name": name,
            "full_name": full_name,
            "owner": self._user(owner),
            "private": False,
            "html_url": f"{self.origin}/{full_name}",
            "url": url,
            "issues_url": f"{url}/issues{{/number}}",
            "has_issues": False,
            "default_branch": "main",
            "fork": True,
        }

    def _pull_json(self, number: int) -> dict[str, Any]:
        if number not in self.pulls:
            raise _HttpError(404, "Not Found")
        pull, issue = self.pulls[number], self.issues[number]
        api = f"{self.base_url}{self.repo_path}"
        ours = f"{self.owner}/{self.repo}"

        def side(ref: str, sha: str, full_name: str | None) -> dict[str, Any]:
            if full_name is None:
                repo, owner = None, issue["user"]
            else:
                repo = self._repository() if full_name == ours else self._fork(full_name)
                owner = repo["owner"]
            label_owner = owner["login"]
            return {
                "label": f"{label_owner}:{ref}",
                "ref": ref,
                "sha": sha,
                "user": owner,
                "repo": repo,
            }

        return {
            "id": issue["id"],
            "node_id": f"PR_{number}",
            "url": f"{api}/pulls/{number}",
            "html_url": issue["html_url"],
            "diff_url": issue["pull_request"]["diff_url"],
            "patch_url": issue["pull_request"]["patch_url"],
            "issue_url": issue["url"],
            "commits_url": f"{api}/pulls/{number}/commits",
            "review_comments_url": f"{api}/pulls/{number}/comments",
            "review_comment_url": f"{api}/pulls/comments{{/number}}",
            "comments_url": issue["comments_url"],
            "statuses_url": f"{api}/statuses/{pull['head_sha']}",
            "number": number,
            "state": issue["state"],
            "locked": False,
            "title": issue["title"],
            "user": issue["user"],
            "body": issue["body"],
            "labels": issue["labels"],
            "milestone": None,
            "active_lock_reason": None,
            "created_at": issue["created_at"],
            "updated_at": issue["updated_at"],
            "closed_at": issue["closed_at"],
            "merged_at": None,
            "merge_commit_sha": None,
            "assignee": None,
            "assignees": [],
            "requested_reviewers": [],
            "requested_teams": [],
            "head": side(pull["head_ref"], pull["head_sha"], pull["head_repo"]),
            "base": side(pull["base_ref"], pull["base_sha"], ours),
            "author_association": "CONTRIBUTOR",
            "auto_merge": None,
            "draft": False,
            "merged": False,
            "mergeable": True,
            "rebaseable": True,
            "mergeable_state": "clean",
            "merged_by": None,
            "comments": issue["comments"],
            "review_comments": 0,
            "maintainer_can_modify": False,
            "commits": 1,
            "additions": 1,
            "deletions": 0,
            "changed_files": 1,
        }

    def _commit_json(self, sha: str) -> dict[str, Any]:
        if sha not in self.shas:
            raise _HttpError(422, f"No commit found for SHA: {sha}")
        api = f"{self.base_url}{self.repo_path}"
        person = {
            "name": "Octo Cat",
            "email": "octocat@example.com",
            "date": "2026-11-20T10:00:00Z",
        }
        return {
            "sha": sha,
            "node_id": f"C_{sha}",
            "url": f"{api}/commits/{sha}",
            "html_url": f"{self.origin}/{self.owner}/{self.repo}/commit/{sha}",
            "comments_url": f"{api}/commits/{sha}/comments",
            "commit": {
                "url": f"{api}/git/commits/{sha}",
                "author": person,
                "committer": person,
                "message": f"Commit {sha[:7]}",
                "tree": {"sha": "0" * 40, "url": f"{api}/git/trees/{'0' * 40}"},
                "comment_count": 0,
            },
            "author": self._user("octocat"),
            "committer": self._user("octocat"),
            "parents": [],
            "stats": {"additions": 1, "deletions": 0, "total": 1},
            "files": [],
        }

    def _compare(self, base: str, head: str) -> dict[str, Any]:
        if base not in self.shas or head not in self.shas:
            raise _HttpError(404, "Not Found")
        merge_base = next(
            (
                p["merge_base"]
                for p in self.pulls.values()
                if (p["base_sha"], p["head_sha"]) == (base, head)
            ),
            base,
        )
        ahead, behind = int(head != merge_base), int(base != merge_base)
        status = {(0, 0): "identical", (1, 0): "ahead", (0, 1): "behind"}.get(
            (ahead, behind), "diverged"
        )
        html = f"{self.origin}/{self.owner}/{self.repo}/compare/{base}...{head}"
        return {
            "url": f"{self.base_url}{self.repo_path}/compare/{base}...{head}",
            "html_url": html,
            "permalink_url": html,
            "diff_url": f"{html}.diff",
            "patch_url": f"{html}.patch",
            "base_commit": self._commit_json(base),
            "merge_base_commit": self._commit_json(merge_base),
            "status": status,
            "ahead_by": ahead,
            "behind_by": behind,
            "total_commits": ahead,
            "commits": [],
            "files": [],
        }

    def _create_status(self, sha: str, payload: Any) -> dict[str, Any]:
        if sha not in self.shas:
            raise _HttpError(422, f"No commit found for SHA: {sha}")
        if not isinstance(payload, dict):
            raise _HttpError(422, "Validation Failed")
        state, description = payload.get("state"), payload.get("description")
        if state not in ("error", "failure", "pending", "success"):
            raise _HttpError(422, "Validation Failed")
        if description is not None and len(description) > 140:
            raise _HttpError(
                422, "Validation Failed: description is too long (maximum is 140 characters)"
            )
        status_id, now = self._new_id(), _now()
        status = {
            "url": f"{self.base_url}{self.repo_path}/statuses/{sha}",
            "avatar_url": None,
            "id": status_id,
            "node_id": f"SC_{status_id}",
            "state": state,
            "description": description,
            "target_url": payload.get("target_url"),
            "context": payload.get("context") or "default",
            "created_at": now,
            "updated_at": now,
            "creator": self._user(),
        }
        self.statuses.setdefault(sha, []).append(status)
        return status

    def _find_comment(self, comment_id: int) -> dict[str, Any]:
        for comments in self.comments.values():
            for comment in comments:
                if comment["id"] == comment_id:
                    return comment
        raise _HttpError(404, "Not Found")

    def _edit_comment(self, comment_id: int, payload: Any) -> dict[str, Any]:
        comment = self._find_comment(comment_id)
        if not isinstance(payload, dict) or not payload.get("body"):
            raise _HttpError(422, "Validation Failed")
        comment["body"] = payload["body"]
        comment["updated_at"] = _now()
        return comment

    def _permission(self, login: str) -> dict[str, Any]:
        if login not in self.permissions:
            raise _HttpError(404, "Not Found")  # GitHub's answer for a non-collaborator
        role = self.permissions[login]
        # ``permission`` is the legacy base role: maintain reads as write, triage as read.
        permission = {"maintain": "write", "triage": "read"}.get(role, role)
        return {"permission": permission, "role_name": role, "user": self._user(login)}

    def _create_issue(self, payload: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(payload, dict) or not payload.get("title"):
            raise _HttpError(422, "Validation Failed")
        number = max(self.issues, default=0) + 1
        now = _now()
        api = f"{self.base_url}{self.repo_path}/issues/{number}"
        issue = {
            "id": self._new_id(),
            "node_id": f"I_{number}",
            "url": api,
            "repository_url": f"{self.base_url}{self.repo_path}",
            "labels_url": f"{api}/labels{{/name}}",
            "comments_url": f"{api}/comments",
            "events_url": f"{api}/events",
            "html_url": f"{self.origin}/{self.owner}/{self.repo}/issues/{number}",
            "number": number,
            "title": payload["title"],
            "body": payload.get("body"),
            "user": self._user(),
            "labels": [self._label(n) for n in dict.fromkeys(payload.get("labels") or [])],
            "state": "open",
            "state_reason": None,
            "locked": False,
            "assignee": None,
            "assignees": [],
            "milestone": None,
            "comments": 0,
            "created_at": now,
            "updated_at": now,
            "closed_at": None,
            "author_association": "OWNER",
        }
        self.issues[number] = issue
        self.comments[number] = []
        return issue

    def _issue(self, number: int) -> dict[str, Any]:
        if number not in self.issues:
            raise _HttpError(404, "Not Found")
        return self.issues[number]

    def _edit(self, number: int, payload: dict[str, Any]) -> dict[str, Any]:
        issue = self._issue(number)
        for key in ("title", "body"):
            if key in payload:
                issue[key] = payload[key]
        if "labels" in payload:
            issue["labels"] = [self._label(n) for n in dict.fromkeys(payload["labels"])]
        if "state" in payload:
            state = payload["state"]
            if state not in ("open", "closed"):
                raise _HttpError(422, "Validation Failed")
            if state != issue["state"]:
                issue["closed_at"] = _now() if state == "closed" else None
            issue["state"] = state
            default_reason = "completed" if state == "closed" else "reopened"
            issue["state_reason"] = payload.get("state_reason", default_reason)
        issue["updated_at"] = _now()
        return issue

    def _add_labels(self, number: int, names: list[str]) -> list[dict[str, Any]]:
        issue = self._issue(number)
        have = [label["name"] for label in issue["labels"]]
        issue["labels"] = [self._label(n) for n in dict.fromkeys(have + names)]
        issue["updated_at"] = _now()
        return issue["labels"]

    def _comment(self, number: int, body: str) -> dict[str, Any]:
        issue = self._issue(number)
        comment_id = self._new_id()
        now = _now()
        comment = {
            "id": comment_id,
            "node_id": f"IC_{comment_id}",
            "url": f"{self.base_url}{self.repo_path}/issues/comments/{comment_id}",
            "html_url": f"{issue['html_url']}#issuecomment-{comment_id}",
            "issue_url": issue["url"],
            "body": body,
            "user": self._user(),
            "created_at": now,
            "updated_at": now,
            "author_association": "OWNER",
        }
        self.comments[number].append(comment)
        issue["comments"] = len(self.comments[number])
        issue["updated_at"] = now
        return comment

    def _list_issues(self, query: dict[str, list[str]]) -> list[dict[str, Any]]:
        state = _one(query, "state", "open")
        labels = [n for n in _one(query, "labels", "").split(",") if n]
        since = _one(query, "since", "")
        sort = _one(query, "sort", "created")
        direction = _one(query, "direction", "desc")
        if state not in ("open", "closed", "all") or sort not in ("created", "updated", "comments"):
            raise _HttpError(422, "Validation Failed")
        found = []
        for issue in self.issues.values():
            if state != "all" and issue["state"] != state:
                continue
            names = {label["name"] for label in issue["labels"]}
            if any(n not in names for n in labels):
                continue
            if since and issue["updated_at"] < since:
                continue
            found.append(issue)
        key = {"created": "created_at", "updated": "updated_at", "comments": "comments"}[sort]
        found.sort(key=lambda i: (i[key], i["number"]), reverse=direction == "desc")
        return found

    # ----- dispatch --------------------------------------------------------------------------

    def handle(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        headers: dict[str, str],
        body: Any,
    ) -> tuple[int, dict[str, str], Any]:
        """Answer one request: record it, check the token, apply faults, route it."""
        status, out_headers, payload, delay = self._answer(method, path, query, headers, body)
        if delay:
            time.sleep(delay)  # outside the lock: other requests are answered meanwhile
        return status, out_headers, payload

    def _answer(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        headers: dict[str, str],
        body: Any,
    ) -> tuple[int, dict[str, str], Any, float]:
        with self._lock:
            self.requests.append(RecordedRequest(method, path, query, headers, body, time.time()))
            extra = self._rate_headers()
            if self.token is not None:
                auth = headers.get("Authorization", "")
                if auth not in (f"token {self.token}", f"Bearer {self.token}"):
                    return (
                        401,
                        extra,
                        {"message": "Bad credentials", "documentation_url": _DOCS},
                        0.0,
                    )
            fault = next((f for f in self.faults if f.matches(method, path)), None)
            if fault is not None:
                fault.times -= 1
                self.faults.extend(fault.then)
                if fault.after:
                    try:
                        self._route(method, path, query, body)
                    except _HttpError:
                        pass
                return fault.status, {**extra, **fault.headers}, fault.body, fault.delay
            try:
                status, out_headers, payload = self._route(method, path, query, body)
            except _HttpError as exc:
                return (
                    exc.status,
                    extra,
                    {"message": exc.message, "documentation_url": _DOCS},
                    0.0,
                )
            return status, {**extra, **out_headers}, payload, 0.0

    def _rate_headers(self) -> dict[str, str]:
        self._remaining = max(self._remaining - 1, 1)
        return {
            "X-RateLimit-Limit": str(_RATE_LIMIT),
            "X-RateLimit-Remaining": str(self._remaining),
            "X-RateLimit-Reset": str(int(time.time()) + 3600),
            "X-RateLimit-Used": str(_RATE_LIMIT - self._remaining),
            "X-RateLimit-Resource": "core",
        }

    def _route(
        self, method: str, path: str, query: dict[str, list[str]], body: Any
    ) -> tuple[int, dict[str, str], Any]:
        if method == "GET" and path == "/rate_limit":
            core = {"limit": _RATE_LIMIT, "remaining": self._remaining, "reset": 0, "used": 0}
            return 200, {}, {"resources": {"core": core}, "rate": core}
        base = self.repo_path
        if path == base and method == "GET":
            return 200, {}, self._repository()
        if path.startswith(base + "/") and not path.startswith(base + "/issues"):
            return self._route_repo(method, path[len(base) :], body)
        if path == f"{base}/issues":
            if method == "POST":
                return 201, {}, self._create_issue(body)
            if method == "GET":
                return self._paginate(path, query, self._list_issues(query))
        comment = re.fullmatch(re.escape(base) + r"/issues/comments/(\d+)", path)
        if comment is not None:
            if method == "GET":
                return 200, {}, self._find_comment(int(comment.group(1)))
            if method == "PATCH":
                return 200, {}, self._edit_comment(int(comment.group(1)), body)
            raise _HttpError(404, "Not Found")
        pattern = re.escape(base) + r"/issues/(\d+)(/comments|/labels(?:/([^/]+))?)?"
        found = re.fullmatch(pattern, path)
        if found is None:
            raise _HttpError(404, "Not Found")
        number, tail, label = int(found.group(1)), found.group(2) or "", found.group(3)
        if tail == "":
            if method == "GET":
                return 200, {}, self._issue(number)
            if method == "PATCH":
                return 200, {}, self._edit(number, body or {})
        elif tail == "/comments":
            if method == "GET":
                self._issue(number)
                return self._paginate(path, query, list(self.comments[number]))
            if method == "POST":
                if not isinstance(body, dict) or not body.get("body"):
                    raise _HttpError(422, "Validation Failed")
                return 201, {}, self._comment(number, body["body"])
        elif label is None:
            if method == "GET":
                return 200, {}, self._issue(number)["labels"]
            if method == "POST":
                names = body.get("labels", []) if isinstance(body, dict) else body
                return 200, {}, self._add_labels(number, list(names or []))
        elif method == "DELETE":
            issue = self._issue(number)
            issue["labels"] = [lb for lb in issue["labels"] if lb["name"] != label]
            issue["updated_at"] = _now()
            return 200, {}, issue["labels"]
        raise _HttpError(404, "Not Found")

    def _route_repo(self, method: str, rest: str, body: Any) -> tuple[int, dict[str, str], Any]:
        """The repository's paths outside ``/issues``: ``rest`` starts after ``{p}``."""
        routes: list[tuple[str, str, Any]] = [
            ("GET", r"/pulls/(\d+)", lambda m: self._pull_json(int(m[1]))),
            ("GET", r"/compare/([^/.]+)\.\.\.([^/.]+)", lambda m: self._compare(m[1], m[2])),
            ("GET", r"/commits/([^/]+)", lambda m: self._commit_json(m[1])),
            ("GET", r"/commits/([^/]+)/statuses", lambda m: self._statuses_of(m[1])),
            ("POST", r"/statuses/([^/]+)", lambda m: self._create_status(m[1], body)),
            ("GET", r"/collaborators/([^/]+)/permission", lambda m: self._permission(m[1])),
        ]
        for verb, pattern, answer in routes:
            found = re.fullmatch(pattern, rest)
            if found is not None and verb == method:
                return (201 if method == "POST" else 200), {}, answer(found)
        raise _HttpError(404, "Not Found")

    def _statuses_of(self, sha: str) -> list[dict[str, Any]]:
        if sha not in self.shas:
            raise _HttpError(422, f"No commit found for SHA: {sha}")
        return list(reversed(self.statuses.get(sha, [])))

    def _paginate(
        self, path: str, query: dict[str, list[str]], items: list[Any]
    ) -> tuple[int, dict[str, str], Any]:
        per_page = min(int(_one(query, "per_page", "30")), self.per_page_max)
        page = max(int(_one(query, "page", "1")), 1)
        chunk = items[(page - 1) * per_page : page * per_page]
        headers: dict[str, str] = {}
        last = max((len(items) + per_page - 1) // per_page, 1)
        if page < last:
            params = {k: v[0] for k, v in query.items()}
            links = []
            for rel, number in (("next", page + 1), ("last", last)):
                url = f"{self.base_url}{path}?{urlencode({**params, 'page': number})}"
                links.append(f'<{url}>; rel="{rel}"')
            headers["Link"] = ", ".join(links)
        return 200, headers, chunk


class _HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class _Handler(BaseHTTPRequestHandler):
    fake: FakeGitHub
    protocol_version = "HTTP/1.1"
    # One write per response and no Nagle delay: otherwise every keep-alive request waits out
    # a 40 ms delayed ACK between the header and body segments.
    wbufsize = 1 << 16
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Silent: tests read ``FakeGitHub.requests`` instead of stderr."""

    def _serve(self) -> None:
        split = urlsplit(self.path)
        path = split.path
        prefix = self.fake.prefix
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if prefix and not (path == prefix or path.startswith(prefix + "/")):
            self._send(404, {}, {"message": "Not Found", "documentation_url": _DOCS})
            return
        path = path[len(prefix) :] or "/"
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            self._send(400, {}, {"message": "Problems parsing JSON", "documentation_url": _DOCS})
            return
        status, headers, payload = self.fake.handle(
            self.command, path, parse_qs(split.query), dict(self.headers.items()), body
        )
        self._send(status, headers, payload)

    def _send(self, status: int, headers: dict[str, str], payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PATCH = do_DELETE = _serve


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _one(query: dict[str, list[str]], key: str, default: str) -> str:
    values = query.get(key)
    return values[0] if values else default
