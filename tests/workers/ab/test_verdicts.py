"""The A/B's verdicts and its report, pure: rows from replicates, the comment and the status."""

from __future__ import annotations

import numpy as np
import pytest

from workers.ab.github import AB_MARKER
from workers.ab.report import ABView, comment_body, reproduce_command, status_of
from workers.ab.verdicts import (
    FAILS_ON_BASE,
    FAILS_ON_HEAD,
    REGRESSION,
    ABRow,
    Side,
    judge,
    judge_all,
    order_rows,
)

SHA_A = "a" * 40
SHA_B = "b" * 40


def _noisy(level: float, n: int, seed: int, spread: float = 0.03) -> tuple[float, ...]:
    rng = np.random.default_rng(seed)
    return tuple(level * np.exp(rng.normal(0, spread, n)))


def test_a_shift_past_the_threshold_in_every_process_is_a_regression() -> None:
    row = judge(
        "m:eval:cpu",
        "latency",
        Side(_noisy(10.0, 6, 1)),
        Side(_noisy(12.0, 6, 2)),
        threshold=0.07,
    )
    assert row.verdict == REGRESSION and row.flagged
    assert row.p_value is not None and row.p_value < 0.01
    assert row.ratio is not None and 1.12 < row.ratio < 1.28
    # The interval holds the estimate and excludes no change.
    assert row.low is not None and row.high is not None and 1.0 < row.low < row.ratio < row.high


def test_identical_builds_are_not_flagged_over_many_draws() -> None:
    flagged = sum(
        judge(
            "m:eval:cpu",
            "latency",
            Side(_noisy(10.0, 6, 2 * k)),
            Side(_noisy(10.0, 6, 2 * k + 1)),
            threshold=0.07,
        ).flagged
        for k in range(300)
    )
    assert flagged == 0


def test_a_significant_change_inside_the_threshold_is_unchanged() -> None:
    row = judge(
        "m:eval:cpu",
        "latency",
        Side(_noisy(10.0, 6, 3, 0.002)),
        Side(_noisy(10.3, 6, 4, 0.002)),
        threshold=0.07,
    )
    assert row.verdict == "unchanged" and not row.flagged


def test_too_few_processes_say_so() -> None:
    row = judge("m:eval:cpu", "latency", Side((10.0, 10.1)), Side((13.0, 13.2)), threshold=0.07)
    assert row.verdict == "not enough processes" and row.p_value is None and not row.flagged


def test_peak_memory_that_repeats_to_the_byte_is_judged_with_ties() -> None:
    same = judge(
        "m:eval:cpu", "cpu_peak_mem", Side((2.0e8,) * 6), Side((2.0e8,) * 6), threshold=0.07
    )
    assert same.verdict == "not significant" and same.p_value == 1.0
    grown = judge(
        "m:eval:cpu", "cpu_peak_mem", Side((2.0e8,) * 6), Side((2.4e8,) * 6), threshold=0.07
    )
    assert grown.verdict == REGRESSION and grown.unit == "bytes"


def test_a_side_that_fails_is_named_and_only_the_head_failing_is_flagged() -> None:
    on_head = judge(
        "m:eval:cpu", "latency", Side((10.0,)), Side(error="TypeError: boom"), threshold=0.07
    )
    assert on_head.verdict == FAILS_ON_HEAD and on_head.flagged
    assert on_head.error == "TypeError: boom" and on_head.ratio is None
    on_base = judge("m:eval:cpu", "latency", Side(error="x"), Side((10.0,)), threshold=0.07)
    assert on_base.verdict == FAILS_ON_BASE and not on_base.flagged


def test_rows_are_flagged_first_then_by_the_size_of_the_change() -> None:
    def row(name: str, ratio: float, verdict: str) -> ABRow:
        return ABRow(name, "latency", "ms", 1.0, ratio, ratio, None, None, 0.5, verdict, 0.07, 6, 6)

    ordered = order_rows(
        [
            row("small", 1.01, "not significant"),
            row("faster", 0.7, "improvement"),
            row("slow", 1.2, REGRESSION),
            row("slower", 1.5, REGRESSION),
        ]
    )
    assert [r.benchmark for r in ordered] == ["slower", "slow", "faster", "small"]


def test_judge_all_takes_each_metrics_threshold() -> None:
    measured = {
        "m:eval:cpu": {
            "latency": (Side(_noisy(10.0, 6, 5)), Side(_noisy(11.0, 6, 6))),
        }
    }
    strict = judge_all(measured, threshold_for=lambda metric, benchmark: 0.05)
    loose = judge_all(measured, threshold_for=lambda metric, benchmark: 0.2)
    assert strict[0].verdict == REGRESSION and strict[0].threshold == 0.05
    assert loose[0].verdict == "unchanged"


def test_a_row_survives_its_json() -> None:
    row = judge(
        "m:eval:cpu", "latency", Side(_noisy(10, 6, 7)), Side(_noisy(12, 6, 8)), threshold=0.07
    )
    data = row.as_dict()
    assert data["flagged"] is True and ABRow.from_dict(data) == row


def _view(rows: list[ABRow], **kwargs: object) -> ABView:
    options = {
        "benchmarks": ["m:eval:cpu"],
        "metrics": ["latency"],
        "processes": 6,
        "samples": 10,
        "provider": {"kind": "python-overlay", "package": "torch"},
    }
    return ABView(1, SHA_A, SHA_B, rows, options=options, **kwargs)  # type: ignore[arg-type]


def test_the_comment_leads_with_the_verdict_and_flags_rows_first() -> None:
    slow = judge(
        "m:eval:cpu", "latency", Side(_noisy(10, 6, 9)), Side(_noisy(13, 6, 10)), threshold=0.07
    )
    calm = judge(
        "n:eval:cpu", "latency", Side(_noisy(10, 6, 11)), Side(_noisy(10, 6, 12)), threshold=0.07
    )
    body = comment_body(_view(order_rows([calm, slow]), code_url="https://github.com/o/r"))
    assert body.startswith(AB_MARKER + "\n## nightbench A/B: 1 regression(s) in `m:eval:cpu`")
    lines = [line for line in body.splitlines() if line.startswith("| ")]
    assert lines[2].startswith("| ❌ | `m:eval:cpu` | latency |")
    assert lines[3].startswith("|  | `n:eval:cpu` | latency |")
    assert f"[`{SHA_A[:10]}`](https://github.com/o/r/commit/{SHA_A})" in body
    assert "--provider python-overlay --package torch --processes 6" in body
    state, description = status_of(_view([slow]))
    assert state == "failure" and description.startswith("1 regressed: m:eval:cpu latency +")


def test_a_quiet_a_b_passes_and_a_moved_head_is_said() -> None:
    calm = judge(
        "n:eval:cpu", "latency", Side(_noisy(10, 6, 13)), Side(_noisy(10, 6, 14)), threshold=0.07
    )
    view = _view([calm], current_head="c" * 40)
    state, description = status_of(view)
    assert state == "success" and "1 benchmark metric(s) compared" in description
    body = comment_body(view)
    assert "no regression" in body and "The PR's head is now `cccccccccc`" in body


def test_a_refusal_is_an_error_and_a_build_failure_a_failure() -> None:
    refused = _view([], error="PR #3 comes from a fork", refused=True)
    assert status_of(refused) == ("error", "PR #3 comes from a fork")
    assert "**Not run:** PR #3 comes from a fork" in comment_body(refused)
    broken = _view([], error="the head (bbbb) does not build: " + "x" * 400)
    state, description = status_of(broken)
    assert state == "failure" and len(description) == 140 and description.endswith("…")


@pytest.mark.parametrize("command", ["python bench.py; rm -rf /"])
def test_the_reproduce_command_is_quoted(command: str) -> None:
    view = ABView(1, SHA_A, SHA_B, [], options={"commands": [command], "processes": 6})
    assert f"--command '{command}'" in reproduce_command(view)
