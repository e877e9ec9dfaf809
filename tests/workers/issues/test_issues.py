"""Filing alerts as issues and syncing triage back, on Postgres, with GitHub as a local stand-in."""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import SecretStr
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from service.config import Settings
from service.models import (
    Alert,
    BenchmarkStability,
    IssueRecord,
    IssueRegression,
    Machine,
    Regression,
    Result,
    Run,
)
from service.regressions.service import history_nights, set_state
from tests.github_server import FakeGitHub
from tests.workers.issues.conftest import TOKEN
from workers.bisect.search import BenchmarkOutcome, BenchmarkVerdict, Outcome, ProbeRecord
from workers.issues.filing import file_alert
from workers.issues.reports.causes import BisectionInput
from workers.issues.sync import SYNC_OVERLAP, sync_issues
from workers.issues.trackers import make_tracker
from workers.issues.trackers.github import GitHubTracker
from workers.issues.trackers.outbox import OutboxTracker

ENV = {
    "torch_version": "2.13.0+cpu",
    "torch_git_version": "a" * 40,
    "cpu_model": "AMD EPYC 7B13",
    "python": "3.11.9",
    "hostname": "bench-cpu-01",
    "cuda": None,
}


def sha(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()


@pytest.fixture
def tracker(fake: FakeGitHub) -> GitHubTracker:
    return GitHubTracker(
        "octo-org/perf",
        SecretStr(TOKEN),
        api_url=fake.base_url,
        backoff_factor=0.01,
        seconds_between_requests=None,
        seconds_between_writes=None,
        sleep=lambda _s: None,
    )


@dataclass
class Night:
    run: Run
    alert: Alert
    regressions: dict[str, Regression]


class World:
    """Series of nightly results in the database, and alerts on top of them."""

    def __init__(self, session: Session) -> None:
        self.s = session
        self.machine = Machine(
            fingerprint=sha("machine")[:32],
            device_class="cpu",
            hostname="bench-cpu-01",
            cpu_model="AMD EPYC 7B13",
        )
        session.add(self.machine)
        session.flush()
        self.previous: Run | None = None

    def _run(self, night: date, torch_commit: str, **kw: object) -> Run:
        run = Run(
            night=night,
            kind=kw.pop("kind", "nightly"),
            status="complete",
            torch_version="2.13.0+cpu",
            torch_git_commit=torch_commit,
            previous_run_id=self.previous.id if self.previous else None,
            **kw,
        )
        self.s.add(run)
        self.s.flush()
        return run

    def _result(
        self,
        run: Run,
        model: str,
        mode: str,
        level: float,
        n: int = 12,
        *,
        metric: str = "latency",
        unit: str = "ms",
    ) -> Result:
        samples = [level * (1 + 0.002 * ((i % 5) - 2)) for i in range(n)]
        result = Result(
            run_id=run.id,
            machine_id=self.machine.id,
            night=run.night,
            model=model,
            mode=mode,
            device="cpu",
            metric=metric,
            unit=unit,
            samples=samples,
            median=level,
            iqr=level * 0.004,
            environment={**ENV, "torch_git_version": run.torch_git_commit},
            series_key=sha(f"{model}:{mode}" + ("" if metric == "latency" else f":{metric}"))[:40],
        )
        self.s.add(result)
        self.s.flush()
        return result

    def history(
        self,
        benchmarks: list[tuple[str, str]],
        nights: int,
        start: date,
        *,
        metric: str = "latency",
        unit: str = "ms",
    ) -> None:
        for i in range(nights):
            run = self._run(start + timedelta(days=i), sha(f"torch-{start}-{i}"))
            for model, mode in benchmarks:
                self._result(run, model, mode, 10.0 + 0.01 * (i % 3), metric=metric, unit=unit)
            self.previous = run

    def regressed_night(
        self,
        night: date,
        levels: dict[tuple[str, str], float],
        *,
        commit_range: list[dict] | None = None,
        beside: float | None = None,
        metric: str = "latency",
        unit: str = "ms",
    ) -> Night:
        """``beside``: the previous night's build measured beside the re-run at this level (ms):
        a paired confirmation (:mod:`service.regressions.paired`)."""
        run = self._run(night, sha(f"torch-{night}"), commit_range=commit_range)
        confirm = self._run(
            night,
            run.torch_git_commit,
            kind="confirm",
            parent_run_id=run.id,
            options={"paired_spec": "torch==2.13.0"} if beside else {},
        )
        paired = (
            self._run(
                night,
                "previous",
                kind="replicate",
                parent_run_id=confirm.id,
                options={"origin": "paired", "round": 1},
            )
            if beside
            else None
        )
        alert = Alert(run_id=run.id, kind="regression", status="open")
        self.s.add(alert)
        self.s.flush()
        regs = {}
        for (model, mode), level in levels.items():
            result = self._result(run, model, mode, level, n=30, metric=metric, unit=unit)
            self._result(confirm, model, mode, level * 1.01, n=30, metric=metric, unit=unit)
            if paired is not None and beside is not None:
                self._result(paired, model, mode, beside, n=30)
            reg = Regression(
                run_id=run.id,
                alert_id=alert.id,
                result_id=result.id,
                series_key=result.series_key,
                model=model,
                mode=mode,
                device="cpu",
                compiler="eager",
                metric=metric,
                unit=unit,
                direction="regression",
                baseline=10.0,
                value=level,
                change=level / 10.0 - 1,
                p_value=0.0002,
                threshold=0.07,
                alertable=True,
                confirmation="reproduced",
                state="untriaged",
            )
            self.s.add(reg)
            regs[f"{model}:{mode}:cpu"] = reg
        self.s.flush()
        self.previous = run
        return Night(run, alert, regs)


def bisection_for(
    commits: list[dict], verdicts: dict[str, BenchmarkOutcome], probes: tuple[ProbeRecord, ...] = ()
) -> BisectionInput:
    culprits: dict[str, list[str]] = {}
    for name, o in verdicts.items():
        if o.culprit:
            culprits.setdefault(o.culprit, []).append(name)
    kind = "culprits" if len(culprits) > 1 else "culprit" if culprits else "inconclusive"
    outcome = Outcome(
        kind=kind,
        benchmarks=tuple(verdicts.values()),
        culprits=tuple((k, tuple(v)) for k, v in culprits.items()),
        skipped=(),
        builds=len({p.sha for p in probes}) or 5,
        rounds=3,
    )
    return BisectionInput(
        outcome=outcome,
        probes=probes,
        commits=tuple(commits),
        repo="/src/pytorch",
        code_url="https://github.com/pytorch/pytorch",
        install_command="pip install -e .",
    )


def commit_range(tag: str, n: int) -> list[dict]:
    """A first-parent range of ``n`` commits after a good one, as ``CommitInfo.as_json()``."""
    shas = [sha(f"{tag}-{i}") for i in range(n + 1)]
    return [
        {
            "sha": s,
            "title": f"Change {i} of {tag}" + (f" (#{6100 + i})" if i else ""),
            "author": f"Dev {i}",
            "author_email": f"dev{i}@example.com",
            "date": "2026-11-20T00:00:00+00:00",
            "pr_number": 6100 + i if i else None,
            "files": [],
            "parent": shas[i - 1] if i else None,
            **({"author_login": f"dev{i}"} if i == 3 else {}),
        }
        for i, s in enumerate(shas)
    ]


@pytest.fixture
def world(db: Session) -> World:
    w = World(db)
    w.history(
        [("resnet18", "eval"), ("resnet18", "train"), ("bert", "eval")], 10, date(2026, 11, 1)
    )
    return w


def records(db: Session) -> list[IssueRecord]:
    return list(db.scalars(select(IssueRecord).order_by(IssueRecord.id)))


# ----- filing ---------------------------------------------------------------------------------


def test_alert_becomes_one_issue_built_from_the_database(
    db: Session, world: World, fake: FakeGitHub, tracker: GitHubTracker, settings: Settings
) -> None:
    night = world.regressed_night(date(2026, 11, 11), {("resnet18", "eval"): 12.5})
    filed = file_alert(db, alert_id=night.alert.id, settings=settings, tracker=tracker)

    assert [f.action for f in filed] == ["created"]
    assert len(fake.issues) == 1
    issue = fake.issues[1]
    body = issue["body"]
    assert issue["title"].startswith("[perf] resnet18 eval cpu latency +25.0% on 2026-11-11")
    assert [label["name"] for label in issue["labels"]] == ["performance", "regression"]
    # The confidence is the detector's confirmation test over tonight and its re-run.
    assert (
        "| resnet18 eval cpu | latency | 10.00 ms → 12.50 ms | **+25.0%** | "
        "p < 0.001 (tonight and its re-run vs 10 nights) |"
    ) in body
    # Ten earlier nights of 12 samples each make the baseline; tonight has 30.
    assert "| 120 / 30 | bench-cpu-01 |" in body
    series = night.regressions["resnet18:eval:cpu"].series_key
    assert f"http://nightbench.test/api/models/resnet18/history.svg?series={series}" in body
    assert f"http://nightbench.test/api/models/resnet18/history?series={series}" in body
    assert "Last 11 nights, oldest first:" in body
    assert "| torch | 2.13.0+cpu | 2.13.0+cpu |" in body
    assert "| CPU | AMD EPYC 7B13 | AMD EPYC 7B13 |" in body
    assert "measured the flagged benchmarks again on the same build: resnet18 eval cpu" in body
    assert "python -m suite run --model resnet18 --mode eval --device cpu" in body

    [record] = records(db)
    assert (record.number, record.state, record.run_id) == (1, "open", night.run.id)
    assert record.fingerprint == filed[0].fingerprint
    assert record.location == tracker.location
    links = db.scalars(select(IssueRegression.regression_id)).all()
    assert links == [night.regressions["resnet18:eval:cpu"].id]
    assert night.alert.status == "filed"


def test_the_issue_says_when_the_build_variant_changed_since_the_baseline_nights(
    db: Session, world: World, fake: FakeGitHub, tracker: GitHubTracker, settings: Settings
) -> None:
    steady = world.regressed_night(date(2026, 11, 11), {("resnet18", "eval"): 12.5})
    file_alert(db, alert_id=steady.alert.id, settings=settings, tracker=tracker)
    assert "Build identity changed" not in fake.issues[1]["body"]
    assert "build variant" not in fake.issues[1]["body"]
    # The next night's wheel is another variant of the same torch (the host's pip moved it).
    moved = world.regressed_night(date(2026, 11, 12), {("bert", "eval"): 13.0})
    for result in db.scalars(select(Result).where(Result.run_id == moved.run.id)):
        result.environment = {**result.environment, "torch_version": "2.13.0+cu130"}
    db.flush()
    file_alert(db, alert_id=moved.alert.id, settings=settings, tracker=tracker)
    body = fake.issues[2]["body"]
    environment = body.split("## Environment", 1)[1].split("\n## ", 1)[0]
    assert "| torch | 2.13.0+cpu | 2.13.0+cu130 |" in environment
    assert "**Build identity changed** between the baseline nights and tonight:" in environment
    # The night report's own line (service.runs.report.environment_changes), said once.
    assert environment.count("- build variant cpu → cu130: the build changed too") == 1
    assert "suite requirements" not in environment


@pytest.mark.parametrize(
    ("spread", "words"),
    [
        (
            0.075,
            "spread 7.5%, so it alerts only from +22.5% (3 times that spread), which this "
            "change (+25.0%) cleared.",
        ),
        # Darkened after it was raised (the night's re-check runs once the night is settled).
        (
            0.1,
            "spread 10.0%, so it alerts only from +30.0% (3 times that spread), which this "
            "change (+25.0%, raised before the verdict) did not.",
        ),
    ],
)
def test_the_issue_of_an_unstable_benchmark_says_its_spread_and_the_bar_it_cleared(
    db: Session,
    world: World,
    fake: FakeGitHub,
    tracker: GitHubTracker,
    settings: Settings,
    spread: float,
    words: str,
) -> None:
    night = world.regressed_night(date(2026, 11, 11), {("resnet18", "eval"): 12.5})
    result = db.scalar(select(Result).where(Result.run_id == night.run.id))
    db.add(
        BenchmarkStability(
            model="resnet18",
            mode="eval",
            device="cpu",
            compiler="eager",
            machine_id=result.machine_id,
            repeats=10,
            medians_ms=[10.0] * 10,
            cv=0.02,
            spread=spread,
            unstable=True,
            threshold=0.07,
        )
    )
    db.flush()
    file_alert(db, alert_id=night.alert.id, settings=settings, tracker=tracker)
    history = fake.issues[1]["body"].split("## History", 1)[1]
    assert f"The benchmark is marked unstable: its processes' medians {words}" in history


def test_a_verdict_of_another_machine_says_nothing_in_the_issue(
    db: Session,
    world: World,
    fake: FakeGitHub,
    tracker: GitHubTracker,
    settings: Settings,
) -> None:
    night = world.regressed_night(date(2026, 11, 11), {("resnet18", "eval"): 12.5})
    other = Machine(fingerprint="f" * 64, device_class="cpu", cpu_model="another-cpu")
    db.add(other)
    db.flush()
    db.add(
        BenchmarkStability(
            model="resnet18",
            mode="eval",
            device="cpu",
            compiler="eager",
            machine_id=other.id,
            repeats=10,
            medians_ms=[10.0] * 10,
            cv=0.02,
            spread=0.1,
            unstable=True,
            threshold=0.07,
        )
    )
    db.flush()
    file_alert(db, alert_id=night.alert.id, settings=settings, tracker=tracker)
    assert "marked unstable" not in fake.issues[1]["body"]


def test_filing_again_for_the_same_run_neither_files_nor_comments(
    db: Session, world: World, fake: FakeGitHub, tracker: GitHubTracker, settings: Settings
) -> None:
    night = world.regressed_night(date(2026, 11, 11), {("resnet18", "eval"): 12.5})
    file_alert(db, alert_id=night.alert.id, settings=settings, tracker=tracker)
    again = file_alert(db, alert_id=night.alert.id, settings=settings, tracker=tracker)
    assert again == []  # filed: nothing left to file or tell
    assert len(fake.issues) == 1 and fake.comments[1] == []
    assert len(records(db)) == 1


def test_issue_created_before_a_crash_is_adopted_not_duplicated(
    db: Session, world: World, fake: FakeGitHub, tracker: GitHubTracker, settings: Settings
) -> None:
    night = world.regressed_night(date(2026, 11, 11), {("resnet18", "eval"): 12.5})
    crashed = db.begin_nested()
    file_alert(db, alert_id=night.alert.id, settings=settings, tracker=tracker)
    crashed.rollback()  # the issue exists on GitHub, its record never committed
    assert records(db) == [] and len(fake.issues) == 1

    filed = file_alert(db, alert_id=night.alert.id, settings=settings, tracker=tracker)
    assert [f.action for f in filed] == ["adopted"]
    assert len(fake.issues) == 1 and fake.comments[1] == []
    assert [r.number for r in records(db)] == [1]


def _file_with_culprit(
    db: Session,
    world: World,
    tracker: GitHubTracker,
    settings: Settings,
    commits: list[dict],
    culprit: str,
    night: date,
    ms: float,
):
    """A night where resnet18 eval regressed to ``ms`` (from 10 ms), filed against ``culprit``."""
    found = {
        "resnet18:eval:cpu": BenchmarkOutcome(
            "resnet18:eval:cpu", "culprit", culprit, (culprit,), 0.25
        )
    }
    regressed = world.regressed_night(night, {("resnet18", "eval"): ms})
    filed = file_alert(
        db,
        alert_id=regressed.alert.id,
        settings=settings,
        tracker=tracker,
        bisection=bisection_for(commits, found),
    )
    return regressed, filed


def test_recurrence_comments_still_regressed_instead_of_a_second_issue(
    db: Session, world: World, fake: FakeGitHub, tracker: GitHubTracker, settings: Settings
) -> None:
    commits = commit_range("r1", 6)
    culprit = commits[3]["sha"]
    first, _ = _file_with_culprit(
        db, world, tracker, settings, commits, culprit, date(2026, 11, 11), 12.5
    )
    second, filed = _file_with_culprit(
        db, world, tracker, settings, commits, culprit, date(2026, 11, 12), 12.6
    )

    assert [f.action for f in filed] == ["commented"]
    assert len(fake.issues) == 1
    [comment] = fake.comments[1]
    assert comment["body"].startswith(f"**Still regressed on 2026-11-12** (run {second.run.id})")
    assert "10.00 ms → 12.60 ms" in comment["body"]
    [record] = records(db)
    assert record.last_night == date(2026, 11, 12)
    linked = set(db.scalars(select(IssueRegression.regression_id)))
    assert linked == {
        first.regressions["resnet18:eval:cpu"].id,
        second.regressions["resnet18:eval:cpu"].id,
    }
    # A task retried for the second night does not comment twice.
    found = {
        "resnet18:eval:cpu": BenchmarkOutcome(
            "resnet18:eval:cpu", "culprit", culprit, (culprit,), 0.25
        )
    }
    file_alert(
        db,
        alert_id=second.alert.id,
        settings=settings,
        tracker=tracker,
        bisection=bisection_for(commits, found),
    )
    assert len(fake.comments[1]) == 1


def test_a_closed_issue_is_not_commented_on_the_regression_gets_a_fresh_one(
    db: Session, world: World, fake: FakeGitHub, tracker: GitHubTracker, settings: Settings
) -> None:
    commits = commit_range("r2", 4)
    culprit = commits[2]["sha"]
    _file_with_culprit(db, world, tracker, settings, commits, culprit, date(2026, 11, 11), 12.5)
    fake.close_issue(1)
    _, filed = _file_with_culprit(
        db, world, tracker, settings, commits, culprit, date(2026, 11, 12), 12.5
    )
    assert [f.action for f in filed] == ["created"]
    assert sorted(fake.issues) == [1, 2] and fake.comments[1] == []
    assert [(r.number, r.state) for r in records(db)] == [(1, "closed"), (2, "open")]


def test_one_issue_per_culprit_and_per_inconclusive_range(
    db: Session, world: World, fake: FakeGitHub, tracker: GitHubTracker, settings: Settings
) -> None:
    commits = commit_range("r3", 8)
    shas = [c["sha"] for c in commits]
    night = world.regressed_night(
        date(2026, 11, 11),
        {("resnet18", "eval"): 12.5, ("resnet18", "train"): 11.5, ("bert", "eval"): 13.0},
        commit_range=commits,
    )
    verdicts = {
        "resnet18:eval:cpu": BenchmarkOutcome(
            "resnet18:eval:cpu", "culprit", shas[3], (shas[3],), 0.25
        ),
        "resnet18:train:cpu": BenchmarkOutcome(
            "resnet18:train:cpu", "culprit", shas[6], (shas[6],), 0.15
        ),
        "bert:eval:cpu": BenchmarkOutcome(
            "bert:eval:cpu",
            "inconclusive",
            None,
            tuple(shas[4:7]),
            0.3,
            "undecided after 240 samples",
        ),
    }

    def probe(
        index: int, purpose: str, side: str, vs_good: str | None, vs_bad: str | None
    ) -> ProbeRecord:
        level = 12.5 if side == "bad" else 10.0
        verdict = BenchmarkVerdict("resnet18:eval:cpu", (level,) * 20, vs_good, vs_bad, side)
        return ProbeRecord(1, shas[index], index, purpose, "measured", 40.0, (verdict,))

    probes = (
        probe(0, "endpoint", "good", None, "different"),
        probe(8, "endpoint", "bad", "different", None),
        probe(4, "search", "bad", "different", "same"),
        probe(2, "search", "good", "same", "different"),
        ProbeRecord(2, shas[5], 5, "search", "skipped", None, (), "setup.py failed"),
        probe(3, "verify", "bad", "different", "same"),
        probe(2, "verify", "good", "same", "different"),
    )
    filed = file_alert(
        db,
        alert_id=night.alert.id,
        settings=settings,
        tracker=tracker,
        bisection=bisection_for(commits, verdicts, probes),
    )

    assert [f.action for f in filed] == ["created"] * 3
    titles = {n: i["title"] for n, i in fake.issues.items()}
    by_title = {t.split(" since ")[-1].split(" in ")[-1]: n for n, t in titles.items()}
    assert any(
        t.startswith("[perf] resnet18 eval cpu latency +25.0% since " + shas[3][:7])
        for t in titles.values()
    )
    assert any(
        t.startswith("[perf] resnet18 train cpu latency +15.0% since " + shas[6][:7])
        for t in titles.values()
    )
    inconclusive = [t for t in titles.values() if " in " in t]
    assert inconclusive == [
        f"[perf] bert eval cpu latency +30.0% in {shas[3][:7]}..{shas[6][:7]} (8 commits)"
    ]
    assert len(by_title) == 3

    eval_issue = next(i for i in fake.issues.values() if "resnet18 eval" in i["title"])
    body = eval_issue["body"]
    assert "cc @dev3" in body  # the culprit's author login came with the commit range
    assert "| pull request | [#6103](https://github.com/pytorch/pytorch/pull/6103) |" in body
    assert "- Culprit verification: passed" in body
    assert "8 commits in range; 6 builds (binary-search floor 4)" in body
    assert "**skipped: setup.py failed**" in body
    assert "nightbench bisect --repo /src/pytorch --good " + shas[2] + " --bad " + shas[3] in body
    assert "--install 'pip install -e .'" in body
    bert_body = next(i for i in fake.issues.values() if "bert" in i["title"])["body"]
    assert "cc @" not in bert_body
    assert (
        "without singling out one commit: undecided after 240 samples." in bert_body
    )  # the track's reason
    for s in shas[4:7]:
        assert s[:7] in bert_body.split("## Commit range")[1].split("##")[0]
    per_issue = {f.number: set(f.regression_ids) for f in filed}
    assert sorted(len(v) for v in per_issue.values()) == [1, 1, 1]


def test_without_github_the_issue_goes_to_the_outbox(
    db: Session, world: World, settings: Settings
) -> None:
    night = world.regressed_night(date(2026, 11, 11), {("resnet18", "eval"): 12.5})
    filed = file_alert(db, alert_id=night.alert.id, settings=settings)
    [record] = records(db)
    assert record.tracker == "outbox"
    text = Path(filed[0].url).read_text()
    assert "# [perf] resnet18 eval cpu latency +25.0%" in text
    assert "10.00 ms → 12.50 ms" in text


@pytest.mark.parametrize(
    ("source", "repository"),
    [
        # The demo's: a local package, no GitHub repository (NIGHTBENCH_SOURCE_GITHUB_REPOSITORY="").
        ({"source_repo_path": Path("/src/minitok"), "source_github_repository": ""}, None),
        # A local clone whose address on GitHub was not given: the pytorch default is not it.
        ({"source_repo_path": Path("/src/minitok")}, None),
        ({"source_github_repository": ""}, None),
        ({"source_github_repository": "example/minitok"}, "example/minitok"),
        ({}, "pytorch/pytorch"),  # commits read from GitHub's pytorch/pytorch
    ],
)
def test_an_unbisected_memory_regression_links_its_commits_only_to_the_source_repository(
    db: Session, settings: Settings, source: dict[str, object], repository: str | None
) -> None:
    world = World(db)
    world.history([("resnet18", "eval")], 10, date(2026, 11, 1), metric="cpu_peak_mem", unit="B")
    commits = commit_range("mem", 3)
    shas = [c["sha"] for c in commits]
    night = world.regressed_night(
        date(2026, 11, 11),
        {("resnet18", "eval"): 12.5},
        commit_range=commits,
        metric="cpu_peak_mem",
        unit="B",
    )
    deployment = settings.model_copy(update=source)

    [filed] = file_alert(db, alert_id=night.alert.id, settings=deployment)
    body = Path(filed.url).read_text()

    assert "resnet18 eval cpu cpu_peak_mem" in body
    good, bad = shas[0], shas[-1]
    if repository is None:
        assert "/compare/" not in body and "/pull/" not in body
        assert f"The night's commit range is `{good[:7]}..{bad[:7]}`" in body
        for s in shas[1:]:
            assert f"| `{s[:7]}` |" in body and f"/commit/{s}" not in body
    else:
        compare = f"https://github.com/{repository}/compare/{good}...{bad}"
        assert f"[`{good[:7]}..{bad[:7]}`]({compare})" in body
        assert f"[`{shas[1][:7]}`](https://github.com/{repository}/commit/{shas[1]})" in body
    if repository != "pytorch/pytorch":
        assert "github.com/pytorch/pytorch/compare/" not in body
        assert not any(f"github.com/pytorch/pytorch/commit/{s}" in body for s in shas)
    # Not bisected: the Reproduce bisects the night's range on the maintainer's clone of the
    # source repository, built as the deployment builds it.
    clone = (
        f"~/{repository.split('/')[1]}"
        if repository
        else ("~/minitok" if "source_repo_path" in source else "PATH/TO/CLONE")
    )
    install = shlex.quote(deployment.bisect_install_command)
    assert f"nightbench bisect --repo {clone} --good {good} --bad {bad} " in body, body
    assert f"--install {install}" in body


def test_nothing_reproduced_files_nothing(
    db: Session, world: World, fake: FakeGitHub, tracker: GitHubTracker, settings: Settings
) -> None:
    night = world.regressed_night(date(2026, 11, 11), {("resnet18", "eval"): 12.5})
    night.regressions["resnet18:eval:cpu"].confirmation = "not_reproduced"
    db.flush()
    assert file_alert(db, alert_id=night.alert.id, settings=settings, tracker=tracker) == []
    assert fake.issues == {} and night.alert.status == "open"


# ----- sync-back ------------------------------------------------------------------------------


def filed_nights(
    db: Session, world: World, tracker: GitHubTracker, settings: Settings
) -> dict[str, Night]:
    """Three nights with one issue each (different benchmarks, so different fingerprints)."""
    nights = {}
    for day, (model, mode) in enumerate(
        [("resnet18", "eval"), ("resnet18", "train"), ("bert", "eval")]
    ):
        night = world.regressed_night(date(2026, 11, 11 + day), {(model, mode): 12.5})
        file_alert(db, alert_id=night.alert.id, settings=settings, tracker=tracker)
        nights[f"{model}:{mode}:cpu"] = night
    return nights


def state_of(night: Night) -> str:
    [reg] = night.regressions.values()
    return reg.state


def test_sync_moves_regressions_by_issue_state_and_labels(
    db: Session, world: World, fake: FakeGitHub, tracker: GitHubTracker, settings: Settings
) -> None:
    nights = filed_nights(db, world, tracker, settings)
    fixed, noise, accepted = (
        nights["resnet18:eval:cpu"],
        nights["resnet18:train:cpu"],
        nights["bert:eval:cpu"],
    )
    numbers = {n: r.number for n, r in zip(nights, records(db), strict=True)}
    assert sync_issues(db, tracker=tracker).changed == {}

    fake.close_issue(numbers["resnet18:eval:cpu"])
    fake.label_issue(numbers["resnet18:train:cpu"], "invalid")
    fake.close_issue(numbers["resnet18:train:cpu"])
    fake.label_issue(numbers["bert:eval:cpu"], "expected")
    report = sync_issues(db, tracker=tracker)
    assert report.seen == 3
    assert (state_of(fixed), state_of(noise), state_of(accepted)) == (
        "fixed",
        "invalid",
        "expected",
    )
    assert [r.state for r in records(db)] == ["closed", "closed", "open"]

    fake.reopen_issue(numbers["resnet18:eval:cpu"])
    sync_issues(db, tracker=tracker)
    assert state_of(fixed) == "untriaged"
    assert records(db)[0].state == "open"

    # Closing as "not planned" is noise too; a revert recorded by hand survives a close.
    fake.close_issue(numbers["resnet18:eval:cpu"], reason="not_planned")
    sync_issues(db, tracker=tracker)
    assert state_of(fixed) == "invalid"
    fake.reopen_issue(numbers["resnet18:eval:cpu"])
    sync_issues(db, tracker=tracker)
    set_state(db, regression_id=fixed.regressions["resnet18:eval:cpu"].id, state="reverted")
    fake.close_issue(numbers["resnet18:eval:cpu"])
    report = sync_issues(db, tracker=tracker)
    assert state_of(fixed) == "reverted"
    assert fixed.regressions["resnet18:eval:cpu"].id not in report.changed


def test_expected_label_resets_the_series_baseline(
    db: Session, world: World, fake: FakeGitHub, tracker: GitHubTracker, settings: Settings
) -> None:
    night = world.regressed_night(date(2026, 11, 11), {("resnet18", "eval"): 12.5})
    file_alert(db, alert_id=night.alert.id, settings=settings, tracker=tracker)
    reg = night.regressions["resnet18:eval:cpu"]
    later = world._result(world._run(date(2026, 11, 12), sha("later")), "resnet18", "eval", 12.5)

    before = history_nights(db, result=later, limit=30)
    assert not any(n.expected for n in before)
    fake.label_issue(1, "expected")
    sync_issues(db, tracker=tracker)
    assert reg.state == "expected"
    after = history_nights(db, result=later, limit=30)
    # Detection's input now marks the regressed night as the start of a new baseline segment.
    # (the night's confirmation re-run follows it, as the detector expects)
    assert [n.expected for n in after] == [False] * 10 + [True, False]
    assert [n.rerun for n in after] == [False] * 11 + [True]


def test_sync_reads_only_changes_since_the_newest_seen(
    db: Session, world: World, fake: FakeGitHub, tracker: GitHubTracker, settings: Settings
) -> None:
    filed_nights(db, world, tracker, settings)
    sync_issues(db, tracker=tracker)
    first_since = fake.requests_to("GET", r"/repos/octo-org/perf/issues")[-1].query.get("since")
    assert first_since is not None  # records carry the creation time as a watermark
    watermark = max(r.remote_updated_at for r in records(db))
    expected = (watermark - SYNC_OVERLAP).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert first_since == [expected]
    assert sync_issues(db, tracker=tracker, since=datetime.now(UTC) + timedelta(days=1)).seen == 0


def test_sync_works_on_sqlite_whose_timestamps_come_back_naive(
    tmp_path: Path, fake: FakeGitHub, tracker: GitHubTracker, settings: Settings
) -> None:
    from service.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'embedded.db'}"  # the embedded default, migrated as it is
    upgrade(url)
    engine = create_engine(url)
    with Session(engine, expire_on_commit=True) as s:
        w = World(s)
        w.history([("resnet18", "eval")], 8, date(2026, 11, 1))
        night = w.regressed_night(date(2026, 11, 9), {("resnet18", "eval"): 12.5})
        file_alert(s, alert_id=night.alert.id, settings=settings, tracker=tracker)
        s.commit()  # read back from SQLite: remote_updated_at without its timezone
        regression_id = night.regressions["resnet18:eval:cpu"].id
        fake.close_issue(1)
        report = sync_issues(s, tracker=tracker)
        assert report.changed == {regression_id: "fixed"}
    engine.dispose()


def test_sync_works_on_outbox_files_edited_by_hand(
    db: Session, world: World, settings: Settings
) -> None:
    night = world.regressed_night(date(2026, 11, 11), {("resnet18", "eval"): 12.5})
    outbox = OutboxTracker(settings.effective_outbox_dir)
    [filed] = file_alert(db, alert_id=night.alert.id, settings=settings, tracker=outbox)
    path = Path(filed.url)
    path.write_text(path.read_text().replace("state: open", "state: closed", 1))
    report = sync_issues(db, tracker=outbox)
    assert report.changed == {night.regressions["resnet18:eval:cpu"].id: "fixed"}


# ----- the periodic task ----------------------------------------------------------------------


def test_sync_task_commits_through_celery(
    database_url: str, fake: FakeGitHub, configure: Callable[..., None]
) -> None:
    from service.config import get_settings
    from service.db import session_scope
    from workers import tasks
    from workers.app import app

    configure(github_repository="octo-org/perf", github_token=TOKEN, github_api_url=fake.base_url)
    assert "sync-issues" in app.conf.beat_schedule
    assert app.conf.beat_schedule["sync-issues"]["task"] == tasks.sync_issues.name == "issues.sync"

    github = make_tracker(get_settings())
    with session_scope() as s:
        world = World(s)
        world.history([("resnet18", "eval")], 8, date(2026, 11, 1))
        night = world.regressed_night(date(2026, 11, 9), {("resnet18", "eval"): 12.5})
        file_alert(s, alert_id=night.alert.id, settings=get_settings(), tracker=github)
        regression_id = night.regressions["resnet18:eval:cpu"].id
    fake.close_issue(1)

    tasks.sync_issues.apply().get()

    with session_scope() as s:
        assert s.get(Regression, regression_id).state == "fixed"  # type: ignore[union-attr]
        [record] = s.scalars(select(IssueRecord)).all()
        assert record.state == "closed" and record.synced_at is not None


def test_a_bisect_driver_report_files_with_commit_details(
    db: Session, world: World, fake: FakeGitHub, tracker: GitHubTracker, settings: Settings
) -> None:
    from workers.bisect.local_driver import BisectionReport
    from workers.bisect.search import BisectionState, SearchConfig
    from workers.commits import CommitInfo

    when = datetime(2026, 11, 10, tzinfo=UTC)
    infos = tuple(
        CommitInfo(
            sha=sha(f"pkg-{i}"),
            title=f"Tokenizer change {i}",
            author_name="Ada Lovelace",
            author_email="ada@example.com",
            date=when,
            pr_number=42 if i == 2 else None,
            files=("tok.py",),
            parent=sha(f"pkg-{i - 1}") if i else None,
        )
        for i in range(4)
    )
    culprit = infos[2].sha
    name = "resnet18:eval:cpu"
    state = BisectionState(
        commits=tuple(c.sha for c in infos),
        benchmarks=(name,),
        config=SearchConfig(),
        probes=tuple(
            ProbeRecord(
                r,
                infos[i].sha,
                i,
                purpose,
                "measured",
                3.0,
                (BenchmarkVerdict(name, (lvl,) * 8, g, b, side),),
            )
            for r, i, purpose, lvl, g, b, side in [
                (0, 0, "endpoint", 10.0, None, "different", "good"),
                (0, 3, "endpoint", 12.5, "different", None, "bad"),
                (1, 2, "search", 12.5, "different", "same", "bad"),
                (2, 1, "search", 10.0, "same", "different", "good"),
            ]
        ),
    )
    outcome = Outcome(
        "culprit",
        (BenchmarkOutcome(name, "culprit", culprit, (culprit,), 0.25),),
        ((culprit, (name,)),),
        (),
        4,
        3,
    )
    report = BisectionReport(state=state, outcome=outcome, commits=infos)
    night = world.regressed_night(date(2026, 11, 11), {("resnet18", "eval"): 12.5})
    bisection = BisectionInput.from_report(
        report, repo="/tmp/tokpkg", code_url=None, install_command="pip install -e ."
    )
    [filed] = file_alert(
        db, alert_id=night.alert.id, settings=settings, tracker=tracker, bisection=bisection
    )
    issue = fake.issues[filed.number]
    assert issue["title"] == (
        f"[perf] resnet18 eval cpu latency +25.0% since {culprit[:7]} (Tokenizer change 2)"
    )
    body = issue["body"]
    assert "| author | Ada Lovelace |" in body and "| pull request | #42 |" in body
    assert "3 commits in range; 4 builds (binary-search floor 2)" in body
    assert f"--repo /tmp/tokpkg --good {infos[1].sha} --bad {culprit}" in body


def _fourteen_nights_then_a_step(db: Session, beside: float | None = None) -> tuple[World, Night]:
    """resnet18 eval at 10 ms for 14 nights from 2026-10-20, then +25% on 2026-11-03 (its
    re-run beside the previous night's build at ``beside`` ms, when given)."""
    world = World(db)
    world.history([("resnet18", "eval")], 14, date(2026, 10, 20))
    return world, world.regressed_night(
        date(2026, 11, 3), {("resnet18", "eval"): 12.5}, beside=beside
    )


def test_confidence_is_the_detectors_confirmation_test_over_tonight_and_the_rerun(
    db: Session, fake: FakeGitHub, tracker: GitHubTracker, settings: Settings
) -> None:
    _, night = _fourteen_nights_then_a_step(db)
    file_alert(db, alert_id=night.alert.id, settings=settings, tracker=tracker)
    # Tonight and its re-run above all 14 baseline nights: the exact one-sided Mann-Whitney U
    # p-value of the detector's confirm() is 1 / C(16, 2) = 1/120.
    assert (
        "| **+25.0%** | p = 0.008 (tonight and its re-run vs 14 nights) |" in fake.issues[1]["body"]
    )


def test_a_paired_confirmation_is_in_the_issue_and_its_confidence(
    db: Session, fake: FakeGitHub, tracker: GitHubTracker, settings: Settings
) -> None:
    # The re-run (12.625 ms: +26.2%) beside the previous night's build at 10.1 ms: +25.0% that
    # evening.
    _, night = _fourteen_nights_then_a_step(db, beside=10.1)
    file_alert(db, alert_id=night.alert.id, settings=settings, tracker=tracker)
    body = fake.issues[1]["body"]
    assert (
        "resnet18 eval cpu latency +26.2% (30 samples; +25.0% against the previous night's "
        "build measured beside it, 1 process(es))"
    ) in " ".join(body.split())
    # The confidence is the confirmation's own judgement: the re-run at the baseline times the
    # paired ratio, still above all 14 nights.
    assert "| **+25.0%** | p = 0.008 (tonight and its re-run vs 14 nights) |" in body


def test_a_paired_check_compares_the_medians_of_process_medians_on_both_sides(
    db: Session, fake: FakeGitHub, tracker: GitHubTracker, settings: Settings
) -> None:
    world, night = _fourteen_nights_then_a_step(db, beside=10.1)
    confirm = db.scalars(
        select(Run).where(Run.parent_run_id == night.run.id, Run.kind == "confirm")
    ).one()
    # The re-run's own rounds: two more processes of tonight's build at 11.11 ms. Its level is
    # the median of 12.625, 11.11 and 11.11, as the confirmation judged it: +10.0% against the
    # previous build's 10.1 ms, not its first process's +25.0%.
    for number in (2, 3):
        round_run = world._run(
            date(2026, 11, 3),
            "tonight",
            kind="replicate",
            parent_run_id=confirm.id,
            options={"origin": "night", "round": number},
        )
        world._result(round_run, "resnet18", "eval", 11.11, n=30)
    file_alert(db, alert_id=night.alert.id, settings=settings, tracker=tracker)
    body = " ".join(fake.issues[1]["body"].split())
    assert "+10.0% against the previous night's build measured beside it, 1 process(es)" in body, (
        body
    )
