"""Rendering of filed issues: fingerprint, title, tables with units, culprit, reproduction."""

from __future__ import annotations

import itertools
import re
import shlex
from dataclasses import replace
from datetime import date

import pytest

from service.errors import InvalidInput
from workers.issues.model import (
    Bisection,
    Change,
    Checks,
    Commit,
    Environment,
    IssueReport,
    Probe,
)
from workers.issues.render.markdown import format_p_value, format_value, sparkline
from workers.issues.render.regression import render_issue, render_recurrence
from workers.issues.trackers.markers import find_fingerprint, fingerprint, marker

CULPRIT = Commit(
    sha="abc1234" + "0" * 33,
    title="Add redundant validity check to index_select",
    author="Jane Doe",
    author_login="janedoe",
    pr_number=61056,
)
PARENT = Commit(sha="def5678" + "1" * 33, title="Fix typo in docs", author="Sam Roe")
GOOD = Commit(sha="1111111" + "2" * 33, title="Last night's build")
BAD = Commit(sha="9999999" + "3" * 33, title="Tonight's build")
MIB = 1024 * 1024


def latency(baseline: float = 100.0, tonight: float = 112.4, **kw: object) -> Change:
    fields: dict[str, object] = {
        "model": "hf_Bert",
        "mode": "train",
        "device": "cuda",
        "metric": "latency",
        "unit": "ms",
        "baseline": baseline,
        "tonight": tonight,
        "p_value": 0.0004,
        "baseline_samples": 140,
        "tonight_samples": 30,
        "machine": "gpu-a100-01",
    }
    fields.update(kw)
    return Change(**fields)  # type: ignore[arg-type]


def culprit_bisection(**kw: object) -> Bisection:
    fields: dict[str, object] = {
        "outcome": "culprit",
        "good": GOOD,
        "bad": BAD,
        "commits": 33,
        "culprit": CULPRIT,
        "culprit_parent": PARENT,
        "verified": True,
        "builds": 8,
        "probes": (
            Probe(GOOD, "same", "different", samples=30, median=100.1, build_seconds=210.0),
            Probe(BAD, "different", "same", samples=30, median=112.5, build_seconds=205.0),
            Probe(CULPRIT, "different", "same", samples=60, median=112.3, build_seconds=31.0),
            Probe(PARENT, "same", "different", samples=60, median=100.0, build_seconds=29.0),
            Probe(Commit("5555555" + "4" * 33, "Broken build"), skipped="compile error"),
        ),
    }
    fields.update(kw)
    return Bisection(**fields)  # type: ignore[arg-type]


def report(**kw: object) -> IssueReport:
    fields: dict[str, object] = {
        "regressions": (latency(),),
        "night": date(2026, 11, 21),
        "tonight": Environment(
            torch_version="2.13.0.dev20261121+cu128",
            torch_commit=BAD.sha,
            gpu="NVIDIA A100-SXM4-80GB",
            driver="570.86.15",
            cuda="12.8",
            cpu="AMD EPYC 7742",
            python="3.11.9",
        ),
        "baseline": Environment(
            torch_version="2.13.0.dev20261120+cu128",
            torch_commit=GOOD.sha,
            gpu="NVIDIA A100-SXM4-80GB",
            driver="570.86.15",
            cuda="12.8",
            cpu="AMD EPYC 7742",
            python="3.11.9",
        ),
        "bisection": culprit_bisection(),
        "checks": Checks("re-ran hf_Bert train cuda with 30 samples: +12.1%", True),
        "alert_id": 17,
        "run_id": 42,
    }
    fields.update(kw)
    return IssueReport(**fields)  # type: ignore[arg-type]


def table_rows(body: str, header: str) -> list[list[str]]:
    """The rows (cells stripped) of the Markdown table whose header line starts with ``header``.

    A ``header`` ending in ``|`` must match the whole header line.
    """
    lines = body.splitlines()
    exact = header.endswith("|")
    start = next(
        i for i, line in enumerate(lines) if (line == header if exact else line.startswith(header))
    )
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
        rows.append([c.strip() for c in cells])
    return rows


# ----- fingerprint --------------------------------------------------------------------------


def test_fingerprint_ignores_order_repetition_and_sha_case() -> None:
    benchmarks = ["hf_Bert:train:cuda", "resnet50:eval:cuda", "hf_T5:train:cuda"]
    metrics = ["latency", "gpu_peak_mem"]
    expected = fingerprint(benchmarks, metrics, culprit=CULPRIT.sha)
    assert re.fullmatch(r"[0-9a-f]{16}", expected)
    for perm in itertools.permutations(benchmarks):
        assert fingerprint([*perm, perm[0]], metrics[::-1], culprit=CULPRIT.sha.upper()) == expected


def test_fingerprint_separates_what_differs() -> None:
    base = fingerprint(["hf_Bert:train:cuda"], ["latency"], culprit=CULPRIT.sha)
    others = {
        fingerprint(["hf_Bert:eval:cuda"], ["latency"], culprit=CULPRIT.sha),
        fingerprint(["hf_Bert:train:cuda"], ["gpu_peak_mem"], culprit=CULPRIT.sha),
        fingerprint(["hf_Bert:train:cuda"], ["latency"], culprit=PARENT.sha),
        fingerprint(["hf_Bert:train:cuda"], ["latency"], commit_range=(GOOD.sha, BAD.sha)),
        fingerprint(["hf_Bert:train:cuda", "x:eval:cpu"], ["latency"], culprit=CULPRIT.sha),
    }
    assert base not in others
    assert len(others) == 5


@pytest.mark.parametrize(
    ("benchmarks", "metrics", "kw", "needle"),
    [
        ([], ["latency"], {"culprit": "abc1234"}, "benchmark"),
        (["a:train:cpu"], [" "], {"culprit": "abc1234"}, "metric"),
        (["a:train:cpu"], ["latency"], {}, "exactly one"),
        (["a:train:cpu"], ["latency"], {"culprit": "a", "commit_range": ("b", "c")}, "exactly one"),
    ],
)
def test_fingerprint_rejects_bad_input(
    benchmarks: list[str], metrics: list[str], kw: dict[str, object], needle: str
) -> None:
    with pytest.raises(InvalidInput, match=needle):
        fingerprint(benchmarks, metrics, **kw)  # type: ignore[arg-type]


def test_marker_round_trips_and_ends_the_body() -> None:
    rendered = render_issue(report())
    assert rendered.body.rstrip().endswith(marker(rendered.fingerprint))
    assert find_fingerprint(rendered.body) == rendered.fingerprint
    assert find_fingerprint("no marker here") is None
    assert find_fingerprint(None) is None
    expected = fingerprint(["hf_Bert:train:cuda"], ["latency"], culprit=CULPRIT.sha)
    assert rendered.fingerprint == expected


# ----- title --------------------------------------------------------------------------------


def test_title_names_benchmark_change_culprit_and_commit_title() -> None:
    rendered = render_issue(report())
    assert rendered.title == (
        "[perf] hf_Bert train cuda latency +12.4% since abc1234 "
        "(Add redundant validity check to index_select)"
    )


def test_title_counts_further_regressions_and_leads_with_the_worst() -> None:
    memory = latency(metric="gpu_peak_mem", unit="bytes", baseline=1000 * MIB, tonight=1300 * MIB)
    rendered = render_issue(report(regressions=(latency(), memory)))
    assert rendered.title.startswith(
        "[perf] hf_Bert train cuda gpu_peak_mem +30.0% and 1 more since"
    )


def test_title_stays_within_githubs_limit() -> None:
    long_culprit = replace(CULPRIT, title="word " * 200)
    rendered = render_issue(report(bisection=culprit_bisection(culprit=long_culprit)))
    assert len(rendered.title) <= 256
    assert rendered.title.endswith("…)")


def test_inconclusive_range_title_and_body() -> None:
    bisection = Bisection(outcome="inconclusive", good=PARENT, bad=CULPRIT, commits=33, builds=9)
    rendered = render_issue(report(bisection=bisection))
    assert rendered.title == (
        "[perf] hf_Bert train cuda latency +12.4% in def5678..abc1234 (33 commits)"
    )
    body = rendered.body
    assert "## Culprit" not in body
    assert "cc @" not in body
    compare = f"https://github.com/pytorch/pytorch/compare/{PARENT.sha}...{CULPRIT.sha}"
    assert compare in body
    assert "without singling out one commit" in body
    assert "not applicable, no single culprit" in body
    expected = fingerprint(
        ["hf_Bert:train:cuda"], ["latency"], commit_range=(PARENT.sha, CULPRIT.sha)
    )
    assert rendered.fingerprint == expected


def test_not_reproduced_and_inconclusive_bisections_give_their_own_reason() -> None:
    why = "the endpoints differ by +3.1%, below the 5% that counts"
    body = render_issue(
        report(
            bisection=Bisection(
                outcome="not_reproduced",
                good=PARENT,
                bad=CULPRIT,
                commits=33,
                builds=2,
                reason=why,
            )
        )
    ).body
    assert "Bisection did not reproduce the change between " in body
    assert f": {why}. That does not clear the nights above" in body
    # Without its reason (a report from an older bisection) the sentence still stands.
    body = render_issue(
        report(
            bisection=Bisection(
                outcome="not_reproduced",
                good=PARENT,
                bad=CULPRIT,
                commits=33,
                builds=2,
            )
        )
    ).body
    assert ": the endpoints measured alike. That does not clear" in body
    body = render_issue(
        report(
            bisection=Bisection(
                outcome="inconclusive",
                good=PARENT,
                bad=CULPRIT,
                commits=33,
                builds=9,
                reason="undecided after 48 samples",
            )
        )
    ).body
    assert "without singling out one commit: undecided after 48 samples." in body
    assert "too close to call" not in body  # the reason says why, not a guess
    # A failed endpoint build is not a close call: the issue says what happened.
    failed = "the good endpoint failed to build: setup.py exited 1"
    body = render_issue(
        report(
            bisection=Bisection(
                outcome="inconclusive",
                good=PARENT,
                bad=CULPRIT,
                commits=33,
                builds=1,
                reason=failed,
            )
        )
    ).body
    assert f"without singling out one commit: {failed}." in body
    assert f"({failed})." in body.split("## Commit range")[1]
    assert "too close to call" not in body and "could not tell the commits apart" not in body
    # Without a reason (an older bisection's report) the old words stand.
    body = render_issue(
        report(
            bisection=Bisection(
                outcome="inconclusive",
                good=PARENT,
                bad=CULPRIT,
                commits=33,
                builds=9,
            )
        )
    ).body
    assert "the measurements there were too close to call." in body
    assert "could not tell the commits apart even with extra samples" in body


def test_not_bisected_range_names_the_night() -> None:
    bisection = Bisection(outcome="not_bisected", good=GOOD, bad=BAD, commits=70)
    rendered = render_issue(report(bisection=bisection))
    assert rendered.title.endswith("on 2026-11-21 (1111111..9999999)")
    assert "has not been bisected" in rendered.body


# ----- body ---------------------------------------------------------------------------------


def test_summary_table_has_units_change_confidence_samples_machine() -> None:
    memory = latency(
        metric="gpu_peak_mem",
        unit="bytes",
        baseline=2048 * MIB,
        tonight=2355.2 * MIB,
        p_value=0.0123,
        baseline_samples=None,
    )
    body = render_issue(report(regressions=(latency(), memory))).body
    rows = table_rows(body, "| benchmark | metric | baseline → tonight")
    assert rows[0] == [
        "hf_Bert train cuda",
        "gpu_peak_mem",
        "2,048.0 MiB → 2,355.2 MiB",
        "**+15.0%**",
        "p = 0.012",
        "n/a / 30",
        "gpu-a100-01",
    ]
    assert rows[1] == [
        "hf_Bert train cuda",
        "latency",
        "100.0 ms → 112.4 ms",
        "**+12.4%**",
        "p < 0.001",
        "140 / 30",
        "gpu-a100-01",
    ]


def test_a_step_that_began_before_tonight_says_since_when() -> None:
    body = render_issue(report(regressions=(latency(since=date(2026, 10, 9)),))).body
    (row,) = table_rows(body, "| benchmark | metric | baseline → tonight")
    assert row[3] == "**+12.4%** since 2026-10-09"


def test_culprit_section_links_commit_pr_and_ccs_author() -> None:
    body = render_issue(report()).body
    assert f"[`abc1234`](https://github.com/pytorch/pytorch/commit/{CULPRIT.sha})" in body
    assert "[#61056](https://github.com/pytorch/pytorch/pull/61056)" in body
    assert "| author | Jane Doe (@janedoe) |" in body
    assert "\ncc @janedoe\n" in body


def test_no_cc_without_a_login_and_bare_shas_without_a_code_url() -> None:
    anonymous = replace(CULPRIT, author_login=None)
    body = render_issue(report(bisection=culprit_bisection(culprit=anonymous), code_url=None)).body
    assert "cc @" not in body
    assert "| author | Jane Doe |" in body
    assert "| commit | `abc1234` |" in body
    assert "](" not in body.split("## Environment")[0]
    # Torch's own commits (environment) still link to torch's repository...
    env = body.split("## Environment")[1].split("##")[0]
    assert f"(https://github.com/pytorch/pytorch/commit/{BAD.sha})" in env
    # ...unless that is switched off too.
    bare = render_issue(report(code_url=None, torch_url=None)).body
    assert "](" not in bare.split("## Environment")[1]


def test_probe_table_shows_verdicts_readings_and_skips() -> None:
    body = render_issue(report()).body
    assert "33 commits in range; 8 builds (binary-search floor 6)" in body
    rows = table_rows(body, "| # | commit | title")
    assert [r[5] for r in rows] == [
        "**good**",
        "**bad**",
        "**bad**",
        "**good**",
        "**skipped: compile error**",
    ]
    culprit_row = rows[2]
    assert culprit_row[3:6] == ["different", "same", "**bad**"]
    assert culprit_row[7:] == ["112.3 ms", "31 s"]
    assert "- Skipped commits (did not build): `5555555` (compile error)" in body


def test_history_embeds_chart_lists_recent_nights_and_api_link() -> None:
    change = latency(
        chart_url="http://nightbench.example/api/charts/hf_Bert.png?metric=latency",
        history_url="http://nightbench.example/api/models/hf_Bert/history?metric=latency",
        recent=(100.0, 100.5, 99.8, 112.4),
    )
    body = render_issue(report(regressions=(change,))).body
    assert "![hf_Bert train cuda latency history](http://nightbench.example/api/charts/" in body
    assert "Last 4 nights, oldest first: `▁▁▁█` 100.0 ms, 100.5 ms, 99.80 ms, 112.4 ms" in body
    assert "History API: http://nightbench.example/api/models/hf_Bert/history" in body


def test_environment_table_sets_baseline_beside_tonight() -> None:
    body = render_issue(report()).body
    rows = {r[0]: r[1:] for r in table_rows(body, "| | baseline | tonight |")}
    assert rows["torch"] == ["2.13.0.dev20261120+cu128", "2.13.0.dev20261121+cu128"]
    assert rows["GPU"] == ["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"]
    assert rows["driver"] == ["570.86.15", "570.86.15"]
    assert rows["CUDA"] == ["12.8", "12.8"]
    assert rows["CPU"] == ["AMD EPYC 7742", "AMD EPYC 7742"]
    assert "1111111" in rows["torch commit"][0] and "9999999" in rows["torch commit"][1]
    assert "machine" not in rows  # neither side recorded one
    assert "allocator" not in rows  # records from before the measurement setup


def test_environment_table_shows_the_measurement_setups_allocator() -> None:
    tonight = replace(report().tonight, allocator="jemalloc")
    body = render_issue(report(tonight=tonight)).body
    rows = {r[0]: r[1:] for r in table_rows(body, "| | baseline | tonight |")}
    assert rows["allocator"][1] == "jemalloc"


def test_a_build_identity_change_is_said_under_the_environment_table() -> None:
    assert "Build identity changed" not in render_issue(report()).body
    line = "build variant cu128 → cu130: the build changed too"
    body = render_issue(report(build_changes=(line,))).body
    environment = body.split("## Environment", 1)[1].split("\n## ", 1)[0]
    assert environment.rstrip().endswith(
        "**Build identity changed** between the baseline nights and tonight:\n- " + line
    )


def test_reproduction_commands_are_copy_paste_ready() -> None:
    compiled = latency(model="resnet50", mode="eval", compiler="inductor")
    body = render_issue(report(regressions=(latency(), compiled))).body
    block = body.split("```bash\n", 1)[1].split("\n```", 1)[0].splitlines()
    assert block[0] == (
        "python -m suite run --model hf_Bert --mode train --device cuda "
        "--out hf_Bert-train-cuda.json"
    )
    assert block[1] == (
        "python -m suite run --model resnet50 --mode eval --device cuda --compiler inductor "
        "--out resnet50-eval-cuda-inductor.json"
    )
    bisect = shlex.split(block[2])
    assert bisect[:2] == ["nightbench", "bisect"]
    flags = dict(zip(bisect[2::2], bisect[3::2], strict=True))
    assert flags["--good"] == PARENT.sha and flags["--bad"] == CULPRIT.sha
    assert flags["--install"] == "python setup.py develop"
    assert flags["--direction"] == "slower"  # as the nightly bisected it
    assert [bisect[i + 1] for i, a in enumerate(bisect) if a == "--benchmark"] == [
        "hf_Bert:train:cuda",
        "resnet50:eval:cuda:inductor",
    ]


def test_checks_section_reports_confirmation_and_verification() -> None:
    body = render_issue(report()).body
    assert "- Confirmation re-run (reproduced): re-ran hf_Bert train cuda with 30 samples" in body
    assert "- Culprit verification: passed" in body
    failed = render_issue(report(bisection=culprit_bisection(verified=False))).body
    assert "- Culprit verification: **failed**" in failed
    unchecked = render_issue(report(checks=Checks())).body
    assert "- Confirmation re-run: not run." in unchecked


def test_improvements_get_their_own_section_not_the_summary() -> None:
    better = latency(model="resnet50", mode="eval", baseline=50.0, tonight=40.0)
    body = render_issue(report(improvements=(better,))).body
    summary = body.split("## Summary", 1)[1].split("##", 1)[0]
    assert "resnet50" not in summary
    rows = table_rows(body, "| benchmark | metric | baseline → tonight | change |")
    assert rows == [["resnet50 eval cuda", "latency", "50.00 ms → 40.00 ms", "-20.0%"]]
    assert "## Improvements" not in render_issue(report()).body


def test_body_is_readable_markdown_not_a_data_dump() -> None:
    awkward = replace(CULPRIT, title="Use a | b in the\nfast path")
    body = render_issue(report(bisection=culprit_bisection(culprit=awkward))).body
    assert '{"' not in body and "': " not in body
    assert "| title | Use a \\| b in the fast path |" in body
    assert "### Bisection" in body and "## Reproduce" in body and "## What was checked" in body


def test_labels_are_deduplicated_in_order() -> None:
    labels = ("performance", "regression", "performance", "oncall: pt2")
    rendered = render_issue(report(labels=labels))
    assert rendered.labels == ("performance", "regression", "oncall: pt2")


def test_recurrence_comment_names_the_night() -> None:
    text = render_recurrence(report(night=date(2026, 11, 22)))
    assert text.startswith("**Still regressed on 2026-11-22** (run 42)")
    assert "100.0 ms → 112.4 ms" in text


# ----- validation and formatting ------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (lambda: report(regressions=()), "at least one regression"),
        (lambda: Commit(sha="not-a-sha"), "commit sha"),
        (lambda: Probe(CULPRIT, verdict_good="maybe"), "verdict_good"),
        (lambda: latency(baseline=0.0), "baseline of hf_Bert train cuda latency"),
        (lambda: latency(tonight=float("nan")), "tonight's value"),
        (lambda: Bisection(outcome="culprit", good=GOOD, bad=BAD), "needs its culprit"),
        (lambda: Bisection(outcome="guess", good=GOOD, bad=BAD), "outcome must be one of"),
    ],
)
def test_bad_input_names_what_was_wrong(build: object, needle: str) -> None:
    with pytest.raises(InvalidInput, match=needle):
        build()  # type: ignore[operator]


def test_format_value_units() -> None:
    assert format_value(12.4123, "ms") == "12.41 ms"
    assert format_value(1234.56, "ms") == "1,234.6 ms"
    assert format_value(0.04567, "ms") == "0.046 ms"
    assert format_value(1536 * MIB, "bytes") == "1,536.0 MiB"
    assert format_p_value(None) == "n/a"
    assert format_p_value(0.05) == "p = 0.050"


def test_sparkline_spans_the_range() -> None:
    assert sparkline([1, 2, 3, 4, 5, 6, 7, 8]) == "▁▂▃▄▅▆▇█"
    assert sparkline([5, 5, 5]) == "▁▁▁"
    assert sparkline([]) == ""


def test_every_table_has_a_rule_and_rows_as_wide_as_its_header() -> None:
    better = latency(model="resnet50", mode="eval", baseline=50.0, tonight=40.0)
    body = render_issue(report(improvements=(better,))).body
    lines = body.splitlines()
    tables = 0
    for i, line in enumerate(lines):
        if line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|")):
            tables += 1
            width = len(re.split(r"(?<!\\)\|", line)) - 2
            assert re.fullmatch(r"\|( --- \|)+", lines[i + 1]), lines[i + 1]
            assert lines[i + 1].count("---") == width
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                assert len(re.split(r"(?<!\\)\|", lines[j])) - 2 == width, lines[j]
                j += 1
    assert tables == 5  # summary, culprit, probes, environment, improvements


def test_confidence_names_what_the_p_value_compares() -> None:
    tested = latency(p_basis="tonight and its re-run vs 14 nights", p_value=1 / 120)
    memory = latency(
        metric="cpu_peak_mem",
        unit="bytes",
        baseline=100 * MIB,
        tonight=130 * MIB,
        p_value=None,
        p_basis="no test: above the baseline's recurring peak",
    )
    body = render_issue(report(regressions=(tested, memory))).body
    rows = table_rows(body, "| benchmark | metric | baseline → tonight | change | confidence")
    assert [r[4] for r in rows] == [
        "no test: above the baseline's recurring peak",
        "p = 0.008 (tonight and its re-run vs 14 nights)",
    ]


def test_a_count_regression_reads_in_instructions_per_step() -> None:
    count = latency(
        model="sac",
        device="cpu",
        metric="cpu_instructions",
        unit="instructions",
        baseline=412.3e6,
        tonight=457.9e6,
        p_value=0.001,
    )
    issue = render_issue(report(regressions=(count,)))
    assert "cpu_instructions went from 412.3 M instr to 457.9 M instr (+11.1%)" in issue.body
    assert "412.3 M instr → 457.9 M instr" in issue.body
