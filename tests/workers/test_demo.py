"""``nightbench demo`` end to end: real nights, detection, confirmation, bisection, filing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from service.errors import InvalidInput
from workers.demo.minitok import AUTHORS, ENCODE, HISTORY_START, POOL, make_package_repository
from workers.demo.run import DEMO_BENCHMARK, run_demo

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.measured
@pytest.mark.slow
def test_demo_runs_end_to_end(database_url: str, tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    # Its own process: the demo installs its settings and the suite's variables while it runs.
    proc = subprocess.run(
        [sys.executable, "-m", "workers.cli", "demo", "--dir", str(workdir), "--json"],
        cwd=ROOT,
        env={**os.environ, "NIGHTBENCH_PROFILE_REGRESSIONS": "true"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    planted = data["planted_culprit"]
    found = [
        r
        for r in data["regressions"]
        if r["benchmark"] == DEMO_BENCHMARK and r["metric"] == "latency"
    ]
    assert found and found[0]["confirmation"] == "reproduced", data["regressions"]
    assert found[0]["change"] > 1.0
    bisection = data["bisection"]
    assert bisection is not None and bisection["outcome"] == "culprit", bisection
    assert [c["sha"] for c in bisection["culprits"]] == [planted]
    assert bisection["culprits"][0]["benchmarks"] == [DEMO_BENCHMARK]
    assert any(p["purpose"] == "verify" for p in bisection["probes"])
    issues = [Path(p).read_text() for p in data["issues"]]
    assert any(planted[:7] in text and "Validate words and pieces" in text for text in issues)
    # What changed: the profile probe of the culprit and its parent names the Python-level
    # checks the culprit added to the tokenizer, not only aten operators, in its first rows.
    [issue] = [text for text in issues if planted[:7] in text]
    changed = issue[issue.index("## What changed") : issue.index("## History")]
    rows = [line for line in changed.splitlines() if line.startswith("| `")][:3]
    assert any("minitok/tokenizer.py: _check_" in row and "(new)" in row for row in rows), changed
    assert "of the profiled step's change" in changed
    # The night measured the package at its commit; the builds of the probes are gone.
    assert not any((workdir / "builds").glob("*/*/src"))


def test_demo_refuses_a_folder_in_use(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("x")
    with pytest.raises(InvalidInput, match="not empty"):
        run_demo(tmp_path)


def test_the_package_repository_has_its_authors_dates_and_culprit(tmp_path: Path) -> None:
    import git

    repo = make_package_repository(tmp_path / "minitok", commits=3, encode_culprit=2)
    with git.Repo(repo.path) as clone:
        assert clone.active_branch.name == "main"
        assert clone.git.config("commit.gpgsign") == "false"
        history = list(clone.iter_commits("main", reverse=True))
        assert [c.hexsha for c in history] == list(repo.shas)
        # Commit k: the k-th author, k hours after the first commit, as author and committer.
        for k, commit in enumerate(history):
            assert commit.author.name == commit.committer.name == AUTHORS[k % len(AUTHORS)][0]
            assert (
                commit.authored_datetime
                == commit.committed_datetime
                == HISTORY_START + timedelta(hours=k)
            )
        assert history[2].summary == "Validate words and pieces while encoding (#1003)"
        assert "pull/1002" in str(history[1].message)
    assert repo.culprits == {ENCODE: repo.shas[2]}


def test_a_worktree_checks_out_the_commit_and_a_bad_one_names_gits_complaint(
    tmp_path: Path,
) -> None:
    import git

    from workers.demo.run import worktree

    repo = make_package_repository(tmp_path / "minitok", commits=2, encode_culprit=2)
    tree = worktree(repo.path, repo.good, tmp_path / "good")
    with git.Repo(tree) as checkout:
        assert checkout.head.is_detached and checkout.head.commit.hexsha == repo.good
    assert "_check_word(word)" not in (tree / "minitok" / "tokenizer.py").read_text()
    with pytest.raises(git.GitCommandError, match=r"worktree add(.|\n)*invalid reference: 0+"):
        worktree(repo.path, "0" * 40, tmp_path / "nowhere")


@pytest.mark.parametrize("first_reproduced", [True, False])
def test_a_step_its_rerun_did_not_reproduce_gets_the_next_night(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, first_reproduced: bool
) -> None:
    # The nights themselves are measured by the end-to-end test above; here, what the demo
    # plays after its bad night: nothing more when the re-run reproduced the step, else one
    # more night at the bad commit over the same commit range (the nightly's "or the next
    # night"), whose outcome the demo then reports.
    from datetime import date, timedelta
    from types import SimpleNamespace

    from workers.demo import run as demo
    from workers.night import plan

    played: list[tuple[date, object, str]] = []

    def create_night(*, night: date, benchmarks: object, commit_range: object = None) -> int:
        played.append((night, commit_range, os.environ["PYTHONPATH"]))
        return len(played)

    def outcome(run_id: int) -> tuple[tuple[dict[str, object], ...], None]:
        done = "reproduced" if first_reproduced or run_id > 3 else "not_reproduced"
        return ({"benchmark": DEMO_BENCHMARK, "metric": "latency", "confirmation": done},), None

    monkeypatch.setattr(plan, "create_night", create_night)
    monkeypatch.setattr(plan, "queued_jobs", lambda run_id: [])
    monkeypatch.setattr(demo, "_night_outcome", outcome)
    commit_range = [{"sha": "b" * 40}]
    said: list[str] = []
    runs = demo._play_nights(
        SimpleNamespace(good="a" * 40, bad="b" * 40),
        (tmp_path / "good", tmp_path / "bad"),
        commit_range,
        baseline_nights=2,
        outer_path=None,
        say=said.append,
    )
    bad = 1 if first_reproduced else 2
    assert runs == list(range(1, 3 + bad))
    assert [p[2] for p in played] == [str(tmp_path / "good")] * 2 + [str(tmp_path / "bad")] * bad
    assert [p[1] for p in played] == [None, None] + [commit_range] * bad
    days = [p[0] for p in played]
    assert all(b - a == timedelta(days=1) for a, b in zip(days, days[1:], strict=False))
    assert days[-1] <= date.today()
    assert ("not reproduced" in said[-1]) is not first_reproduced, said


def _aten_ops(module_source: str, table: object, ids: object, offsets: object) -> list[str]:
    """The aten operators one call of ``pool`` (from ``module_source``) dispatches, in order."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    namespace: dict[str, object] = {}
    exec(compile(module_source, "minitok/tensors.py", "exec"), namespace)  # noqa: S102
    seen: list[str] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            seen.append(str(func.overloadpacket.__name__))
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Record():
        out = namespace["pool"](table, ids, offsets)  # type: ignore[operator]
    assert isinstance(out, torch.Tensor)
    return seen


def test_the_aten_op_culprit_copies_the_table_and_its_parent_does_not(tmp_path: Path) -> None:
    # The aten-op demo's culprit commit, as generated: minitok.tensors.pool at the culprit
    # dispatches a copy of the whole table that its parent does not, and pools the same values.
    import torch

    repo = make_package_repository(tmp_path / "minitok", commits=3, pool_culprit=2, vocab_size=500)
    culprit = repo.culprits[POOL]
    parent = repo.shas[repo.shas.index(culprit) - 1]

    def show(sha: str, path: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo.path), "show", f"{sha}:{path}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    table = torch.randn(500, 8, generator=torch.Generator().manual_seed(0))
    ids, offsets = torch.tensor([1, 7, 499, 3, 3]), torch.tensor([0, 2])
    before = _aten_ops(show(parent, "minitok/tensors.py"), table, ids, offsets)
    after = _aten_ops(show(culprit, "minitok/tensors.py"), table, ids, offsets)
    assert "copy_" not in before and "clone" not in before, before
    assert "copy_" in after or "clone" in after, after
    assert [op for op in after if op not in ("t", "clone", "copy_", "empty_like")] == before
    # Every commit before the culprit is clean and every one from it on copies.
    for k, sha in enumerate(repo.shas):
        copies = "table.t().contiguous()" in show(sha, "minitok/tensors.py")
        assert copies is (k >= repo.shas.index(culprit)), (k, sha)
    # The vocabulary the model's table is sized by is the repository's, from the first commit.
    namespace: dict[str, object] = {}
    exec(compile(show(repo.good, "minitok/vocab.py"), "vocab.py", "exec"), namespace)  # noqa: S102
    assert len(namespace["build_vocab"]()) == 500  # type: ignore[operator]


def test_the_demo_refuses_an_unknown_culprit_kind_and_too_few_counted_nights(
    tmp_path: Path,
) -> None:
    with pytest.raises(InvalidInput, match="culprit kind must be one of python-check, aten-op"):
        run_demo(tmp_path / "a", culprit_kind="segfault")
    with pytest.raises(InvalidInput, match="counted nights must be 0 or lie in 4..14, got 2"):
        run_demo(tmp_path / "b", counted_nights=2)
    with pytest.raises(InvalidInput, match="counted nights"):
        run_demo(tmp_path / "c", baseline_nights=7, counted_nights=8)
    # Refused before anything is written.
    assert not any(tmp_path.iterdir())


def test_only_the_last_nights_count_instructions(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # With counted nights, the last good nights and the bad night run the count pass (the
    # setting each night's tasks read); the earlier nights do not.
    from datetime import date
    from types import SimpleNamespace

    from service.config import get_settings
    from workers.demo import run as demo
    from workers.night import plan

    counting: list[bool] = []

    def create_night(*, night: date, benchmarks: object, commit_range: object = None) -> int:
        counting.append(get_settings().count_instructions)
        return len(counting)

    def outcome(run_id: int) -> tuple[tuple[dict[str, object], ...], None]:
        return (
            {
                "benchmark": DEMO_BENCHMARK,
                "metric": "cpu_instructions",
                "confirmation": "reproduced",
            },
        ), None

    monkeypatch.setattr(plan, "create_night", create_night)
    monkeypatch.setattr(plan, "queued_jobs", lambda run_id: [])
    monkeypatch.setattr(demo, "_night_outcome", outcome)
    runs = demo._play_nights(
        SimpleNamespace(good="a" * 40, bad="b" * 40),
        (tmp_path / "good", tmp_path / "bad"),
        [{"sha": "b" * 40}],
        baseline_nights=6,
        outer_path=None,
        say=lambda text: None,
        count_from=6 - 4,
    )
    # A reproduced count regression settles the bad night, as a latency one does.
    assert len(runs) == 7
    assert counting == [False, False, True, True, True, True, True]


def test_the_demo_installs_its_settings_without_writing_them_to_the_environment(
    tmp_path: Path,
) -> None:
    # The demo's deployment is a Settings object (service.config.use_settings); only what its
    # suite processes read from their environment is set there, and everything is put back.
    from service.config import get_settings
    from workers.demo import run as demo

    before = dict(os.environ)
    outer = get_settings()
    settings = demo._demo_settings(tmp_path, tmp_path / "minitok", counting=True)
    with demo._deployment(settings), demo._environment(demo._suite_variables()):
        inside = get_settings()
        assert inside.data_dir == tmp_path / "data" and inside.embedded
        assert inside.source_repo_path == tmp_path / "minitok" and inside.source_repository is None
        assert (inside.count_models, inside.count_batch_size) == (["tokbag"], 2)
        assert not inside.count_instructions and not inside.stability_recheck
        changed = {k for k, v in os.environ.items() if before.get(k) != v}
        assert changed <= {"NIGHTBENCH_SUITE_EXTRA_MODELS", "OMP_NUM_THREADS"}
        assert os.environ["NIGHTBENCH_SUITE_EXTRA_MODELS"].endswith("demo_models")
    assert dict(os.environ) == before
    assert get_settings() == outer
