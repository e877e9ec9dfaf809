"""The issue's "What changed" section, rendered from a stored profile diff; the targets the
profile probe picks from a bisection's answer."""

from __future__ import annotations

from dataclasses import replace

from service.profiles import Profile, ProfileRow, diff_json, diff_profiles
from tests.workers.issues.test_issue_render import CULPRIT, PARENT, report
from workers.bisect.profile_probe import ProfileTarget, profile_targets
from workers.issues.model import WhatChanged
from workers.issues.render.regression import render_issue


def _ops(rows: dict[str, float], unit: str = "us", metric: str = "latency") -> Profile:
    return Profile(
        metric=metric,
        unit=unit,
        rows={n: ProfileRow(name=n, values=(v,), calls=1.0) for n, v in rows.items()},
    )


BEFORE = _ops({"aten::addmm": 600.0, "aten::relu": 40.0, "minitok/__init__.py: encode": 300.0})
# A planted clone of a large activation, and the tokenizer's new per-call check.
AFTER = _ops(
    {
        "aten::addmm": 602.0,
        "aten::relu": 41.0,
        "aten::clone": 900.0,
        "minitok/__init__.py: encode": 1500.0,
    }
)
DIFF = diff_json(diff_profiles(BEFORE, AFTER))


def answer(**kw: object) -> WhatChanged:
    fields: dict[str, object] = {
        "benchmark": "hf_Bert:train:cuda",
        "metric": "latency",
        "before": PARENT.sha,
        "after": CULPRIT.sha,
        "culprit": True,
        "diff": DIFF,
        "traced": True,
        "diff_url": "http://nb.example/api/regressions/7/profile",
        "trace_urls": (
            "http://nb.example/api/regressions/7/profile/trace/before",
            "http://nb.example/api/regressions/7/profile/trace/after",
        ),
    }
    fields.update(kw)
    return WhatChanged(**fields)  # type: ignore[arg-type]


def section(body: str) -> str:
    start = body.index("## What changed")
    end = body.find("\n## ", start + 1)
    return body[start : end if end != -1 else None]


def test_the_section_names_the_planted_op_and_function_first_with_their_share() -> None:
    body = render_issue(report(what_changed=(answer(),))).body
    text = section(body)
    lines = [line for line in text.splitlines() if line.startswith("| `")]
    assert lines[0].startswith("| `minitok/__init__.py: encode` | 300.0 µs | 1,500.0 µs")
    assert "+1,200.0 µs (+400.0%)" in lines[0] and lines[0].endswith("| 57% |")
    assert lines[1].startswith("| `aten::clone` | 0.0 µs | 900.0 µs | +900.0 µs (new) | 43% |")
    assert len(lines) == 2  # addmm and relu moved by less than the noise
    assert "These rows explain 100% of the profiled step's change (+2,103.0 µs" in text
    assert "940.0 µs → 3,043.0 µs per step" in text
    assert f"`{PARENT.sha[:7]}`" in text and "(the culprit's parent)" in text
    assert "Full diff: http://nb.example/api/regressions/7/profile" in text
    assert "profile/trace/before, http://nb.example/api/regressions/7/profile/trace/after" in text
    # After the culprit, before the environment.
    assert body.index("## Culprit") < body.index("## What changed") < body.index("## Environment")


def test_a_failed_probe_is_one_line_saying_why() -> None:
    failed = answer(diff=None, failed="hf_Bert:train:cuda on 1f2e3d: out of memory", traced=False)
    text = section(render_issue(report(what_changed=(failed,))).body)
    assert "not profiled: hf_Bert:train:cuda on 1f2e3d: out of memory." in text
    assert "|" not in text and "Full diff" not in text


def test_identical_profiles_say_nothing_moved_above_the_noise() -> None:
    flat = diff_json(diff_profiles(BEFORE, BEFORE))
    text = section(render_issue(report(what_changed=(answer(diff=flat),))).body)
    assert "No operator or function moved above the noise (3 compared" in text
    assert "| `" not in text


def test_no_profile_no_section() -> None:
    assert "## What changed" not in render_issue(report()).body


def test_instruction_counts_print_in_instructions() -> None:
    before = _ops({"tok.py: encode": 2_000_000.0}, "instructions", "cpu_instructions")
    after = _ops({"tok.py: encode": 5_000_000.0}, "instructions", "cpu_instructions")
    counted = answer(metric="cpu_instructions", diff=diff_json(diff_profiles(before, after)))
    text = section(render_issue(report(what_changed=(replace(counted, trace_urls=()),))).body)
    assert "| `tok.py: encode` | 2,000,000 instr | 5,000,000 instr | +3,000,000 instr" in text
    assert "callgrind: self instructions per step" in text


def test_a_count_profile_names_the_python_function_first_then_the_interpreter() -> None:
    c_before = _ops(
        {"Python/ceval.c:_PyEval_EvalFrameDefault": 4_000_000.0, "gemm": 9_000_000.0},
        "instructions",
        "cpu_instructions",
    )
    c_after = _ops(
        {
            "Python/ceval.c:_PyEval_EvalFrameDefault": 48_000_000.0,
            "Python/bltinmodule.c:builtin_all": 1_400_000.0,
            "gemm": 9_000_000.0,
        },
        "instructions",
        "cpu_instructions",
    )
    py_before = _ops({"minitok/__init__.py: encode": 90_000.0}, "bytecodes", "cpu_instructions")
    py_after = _ops(
        {"minitok/__init__.py: encode": 91_000.0, "minitok/__init__.py: _check_piece": 600_000.0},
        "bytecodes",
        "cpu_instructions",
    )
    diff = diff_json(diff_profiles(c_before, c_after), python=diff_profiles(py_before, py_after))
    counted = answer(metric="cpu_instructions", diff=diff, trace_urls=())
    text = section(render_issue(report(what_changed=(counted,))).body)
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert rows[0].startswith(
        "| `minitok/__init__.py: _check_piece` | 0 bytecodes | 600,000 bytecodes | "
        "+600,000 bytecodes (new) | 100% |"
    )
    assert rows[1].startswith("| `minitok/__init__.py: encode` | 90,000 bytecodes")
    assert rows[2].startswith("| `Python/ceval.c:_PyEval_EvalFrameDefault` | 4,000,000 instr")
    assert "These rows explain 100% of the profiled step's change (+601,000 bytecodes" in text
    assert text.index("Python functions, by the bytecodes") < text.index(
        "C functions, by instructions"
    )
    # Without a Python section: the C table alone, as before.
    alone = answer(
        metric="cpu_instructions", diff=diff_json(diff_profiles(c_before, c_after)), trace_urls=()
    )
    text = section(render_issue(report(what_changed=(alone,))).body)
    assert "bytecodes" not in text and "Python/ceval.c" in text


COMMITS = [{"sha": s} for s in ("g", "c1", "c2", "c3", "c4", "b")]


def test_targets_are_the_culprit_and_its_parent_first_then_a_range() -> None:
    result = {
        "benchmarks": [
            {"benchmark": "a:eval:cpu", "status": "inconclusive", "range": ["c2", "c3"]},
            {"benchmark": "b:eval:cpu", "status": "culprit", "culprit": "c4", "range": ["c4"]},
            {"benchmark": "c:eval:cpu", "status": "culprit", "culprit": "c4", "range": ["c4"]},
            {"benchmark": "d:eval:cpu", "status": "not_reproduced", "range": []},
        ]
    }
    assert profile_targets(result, COMMITS, limit=5) == [
        ProfileTarget("b:eval:cpu", "c3", "c4", True),  # c's culprit is the same pair of builds
        ProfileTarget("a:eval:cpu", "c1", "c3", False),
        ProfileTarget("d:eval:cpu", "g", "b", False),
    ]
    assert profile_targets(result, COMMITS, limit=1) == [
        ProfileTarget("b:eval:cpu", "c3", "c4", True)
    ]
    assert profile_targets({"benchmarks": []}, COMMITS, limit=3) == []
    assert profile_targets(result, COMMITS[:1], limit=3) == []
