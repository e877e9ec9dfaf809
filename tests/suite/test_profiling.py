"""Profiles of a benchmark's step (``suite/profiling.py``): callgrind_annotate's output read,
standardised and diffed, and a real operator table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.profiles import Profile, ProfileRow, RowStatus, diff_profiles, profile_from_json
from suite import profiling

# callgrind_annotate --inclusive=no --threshold=100 --show-percs=no (valgrind 3.19), trimmed:
# one counted window of a step, from a torch built in /tmp/build-a.
ANNOTATE_A = """\
--------------------------------------------------------------------------------
Profile data file 'callgrind.out.1' (creator: callgrind-3.19.0)
--------------------------------------------------------------------------------
Events recorded:  Ir
Events shown:     Ir
Thresholds:       100

--------------------------------------------------------------------------------
Ir
--------------------------------------------------------------------------------
1,000,000  PROGRAM TOTALS

--------------------------------------------------------------------------------
Ir      file:function
--------------------------------------------------------------------------------
1,000,000  ???:0x0000000000109150 [/usr/bin/python3.11]
  400,000  /tmp/build-a/build/aten/src/ATen/native/cpu/BlasKernel.cpp:gemm [/tmp/a/lib/libtorch_cpu.so]
  250,000  /usr/src/python3.11/Python/ceval.c:_PyEval_EvalFrameDefault [/usr/bin/python3.11]
  200,000  /usr/src/python3.11/Objects/dictobject.c:lookdict_unicode [/usr/bin/python3.11]
  150,000  /tmp/build-a/build/../c10/core/TensorImpl.cpp:c10::TensorImpl::sizes() const [/tmp/a/lib/libc10.so]
   60,000  ???:0x000000002a0ba000
   40,000  ???:0x000000002a1a7000

"""
# The same step on a build made elsewhere, with a Python-level check added on the hot path.
ANNOTATE_B = """\
--------------------------------------------------------------------------------
Ir
--------------------------------------------------------------------------------
1,230,000  PROGRAM TOTALS

--------------------------------------------------------------------------------
Ir      file:function
--------------------------------------------------------------------------------
  400,000  /home/ci/b/build/aten/src/ATen/native/cpu/BlasKernel.cpp:gemm [/home/ci/venv/lib/libtorch_cpu.so]
  330,000  /opt/cpython/Python/ceval.c:_PyEval_EvalFrameDefault [/usr/bin/python3.11]
  210,000  /opt/cpython/Objects/dictobject.c:lookdict_unicode [/usr/bin/python3.11]
  150,000  /home/ci/b/build/../c10/core/TensorImpl.cpp:c10::TensorImpl::sizes() const [/x/libc10.so]
   40,000  /opt/cpython/Objects/abstract.c:PyObject_IsInstance [/usr/bin/python3.11]
   60,000  ???:0x000000002a0ce000
   40,000  ???:0x000000002a1bb000
"""


def test_parse_annotate_reads_the_total_and_the_functions() -> None:
    total, rows = profiling.parse_annotate(ANNOTATE_A)
    assert total == 1_000_000
    # The row equal to the program total is callgrind's top-level stand-in, left out.
    assert [ir for ir, _ in rows] == [400_000, 250_000, 200_000, 150_000, 60_000, 40_000]
    assert rows[0][1].endswith("BlasKernel.cpp:gemm [/tmp/a/lib/libtorch_cpu.so]")
    with pytest.raises(ValueError, match="not callgrind_annotate output"):
        profiling.parse_annotate("Ir\n--\n")


def test_standardise_strips_build_paths_and_denoises_per_step() -> None:
    self_a, incl_a = profiling.standardise(profiling.parse_annotate(ANNOTATE_A)[1], [], steps=2)
    assert self_a == {
        "build/aten/src/ATen/native/cpu/BlasKernel.cpp:gemm": 200_000.0,
        "Python/ceval.c:_PyEval_EvalFrameDefault": 125_000.0,
        "build/../c10/core/TensorImpl.cpp:c10::TensorImpl::sizes() const": 75_000.0,
        # JIT kernels at addresses that move between processes: one row.
        profiling.UNNAMED_CODE: 50_000.0,
    }
    assert incl_a == {}


def _functions(text: str) -> Profile:
    self_counts, _ = profiling.standardise(profiling.parse_annotate(text)[1], [], steps=1)
    return Profile(
        metric="cpu_instructions",
        unit="instructions",
        rows={n: ProfileRow(name=n, values=(v,)) for n, v in self_counts.items()},
    )


def test_a_python_level_check_is_named_across_builds_made_in_different_places() -> None:
    diff = diff_profiles(_functions(ANNOTATE_A), _functions(ANNOTATE_B))
    assert [(r.name, r.change, r.status) for r in diff.rows] == [
        ("Python/ceval.c:_PyEval_EvalFrameDefault", 80_000.0, RowStatus.CHANGED),
        ("Objects/abstract.c:PyObject_IsInstance", 40_000.0, RowStatus.NEW),
    ]
    assert diff.explained == pytest.approx(1.0)
    # Same build both sides: nothing.
    assert diff_profiles(_functions(ANNOTATE_B), _functions(ANNOTATE_B)).rows == ()


def test_an_operator_table_of_a_real_step_with_planted_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NIGHTBENCH_SUITE_INJECT_WORK", "dqn:eval=0.5")
    cfg = profiling.ProfileConfig(warmup_steps=1, steps=1, windows=2)
    trace = tmp_path / "trace.json"
    doc = profiling.profile_operators("dqn", "eval", batch_size=2, config=cfg, trace=trace)
    assert doc["error"] is None, doc["error"]
    assert (doc["metric"], doc["unit"], doc["batch_size"]) == ("latency", "us", 2)
    rows = {r["name"]: r for r in doc["rows"]}
    assert rows["aten::addmm"]["calls"] == 2.0  # dqn's two linear layers, per step
    assert rows["aten::mm"]["calls"] >= 1.0 and all(v > 0 for v in rows["aten::mm"]["self"])
    assert len(doc["totals"]) == 2 and all(t > 0 for t in doc["totals"])
    assert "traceEvents" in json.loads(trace.read_text())


# A step's callgrind rows of CPython's interpreter loop, split over its inlined headers, the
# headers under the build's own tree (valgrind 3.19, CPython 3.11.7 built by pyenv).
ANNOTATE_INLINED = """\
--------------------------------------------------------------------------------
Ir
--------------------------------------------------------------------------------
700,000  PROGRAM TOTALS

--------------------------------------------------------------------------------
Ir      file:function
--------------------------------------------------------------------------------
  400,000  /usr/src/python3.11/Python/ceval.c:_PyEval_EvalFrameDefault'2 [/usr/bin/python3.11]
  200,000  /tmp/python-build.20260509/Python-3.11.7/./Include/internal/pycore_frame.h:_PyEval_EvalFrameDefault'2 [/usr/bin/python3.11]
   60,000  /tmp/python-build.20260509/Python-3.11.7/./Include/object.h:_Py_DECREF [/usr/bin/python3.11]
   40,000  /tmp/python-build.20260509/Python-3.11.7/./Include/internal/pycore_ceval.h:_PyEval_EvalFrameDefault'2 [/usr/bin/python3.11]
"""


def test_inlined_header_rows_fold_into_their_function_without_the_build_tree() -> None:
    self_counts, _ = profiling.standardise(
        profiling.parse_annotate(ANNOTATE_INLINED)[1], [], steps=1
    )
    assert self_counts == {
        "Python/ceval.c:_PyEval_EvalFrameDefault'2": 640_000.0,
        # A header function with no source-file row of its own stays, its path stripped.
        "Include/object.h:_Py_DECREF": 60_000.0,
    }
    # Two source files with the same function: a header row is not guessed into either.
    ambiguous = {"a.c:f": 1.0, "b.c:f": 2.0, "x.h:f": 3.0}
    assert profiling.fold_inlined(ambiguous) == ambiguous


def _planted_check(piece: object) -> None:
    if not isinstance(piece, str) or not piece.isidentifier():
        raise ValueError(piece)


def test_bytecodes_count_each_python_function_the_same_every_time() -> None:
    def encode(words: list[str], check: bool) -> int:
        total = 0
        for w in words:
            if check:
                _planted_check(w)
            total += len(w)
        return total

    words = ["alpha", "beta", "gamma"] * 10
    plain = profiling.count_bytecodes(lambda: encode(words, False), steps=3)
    again = profiling.count_bytecodes(lambda: encode(words, False), steps=3)
    checked = profiling.count_bytecodes(lambda: encode(words, True), steps=3)
    assert plain == again  # deterministic
    name = "suite/test_profiling.py: _planted_check"
    assert name not in plain
    calls, executed = checked[name]
    assert calls == 30.0 and executed > 30 * 5  # per step: one call a word, several bytecodes
    encoded = (
        "suite/test_profiling.py: "
        "test_bytecodes_count_each_python_function_the_same_every_time.<locals>.encode"
    )
    assert checked[encoded][1] > plain[encoded][1]  # the call and the branch cost encode too
    with pytest.raises(ValueError, match="steps must be at least 1"):
        profiling.count_bytecodes(lambda: None, steps=0)


def _python(doc: dict[str, object]) -> Profile:
    return profile_from_json(doc)


def test_a_python_check_in_a_real_model_is_named_by_its_bytecodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch.nn.functional as F

    cfg = profiling.ProfileConfig(warmup_steps=1, steps=2, windows=2)
    before = profiling.profile_bytecodes("dqn", "eval", 2, cfg)
    repeat = profiling.profile_bytecodes("dqn", "eval", 2, cfg)
    linear = F.linear

    def checked_linear(x, weight, bias=None):  # type: ignore[no-untyped-def]
        _planted_check(str(weight.dtype).replace("torch.", "t_"))
        return linear(x, weight, bias)

    monkeypatch.setattr(F, "linear", checked_linear)
    after = profiling.profile_bytecodes("dqn", "eval", 2, cfg)
    for doc in (before, after):
        assert doc["error"] is None and doc["unit"] == "bytecodes" and doc["batch_size"] == 2
    assert before["totals"][0] == before["totals"][1] == repeat["totals"][0]
    assert "modules/module.py: Module._call_impl" in {r["name"] for r in before["rows"]}
    assert diff_profiles(_python(before), _python(repeat)).rows == ()
    diff = diff_profiles(_python(before), _python(after))
    assert diff.rule.floor == 20.0  # the bytecode rule, chosen by the unit
    names = [r.name for r in diff.rows]
    assert set(names[:2]) == {
        "suite/test_profiling.py: test_a_python_check_in_a_real_model_is_named_by_its_bytecodes"
        ".<locals>.checked_linear",
        "suite/test_profiling.py: _planted_check",
    }
    assert diff.explained == pytest.approx(1.0)


def test_a_count_regression_is_profiled_at_the_count_series_settings() -> None:
    """The function and bytecode profiles of a ``cpu_instructions`` regression profile the step
    its count series counts: style_transfer_jit at its 32-pixel count image, not its own 96."""
    from suite.registry import load_model_class

    cls = load_model_class("style_transfer_jit")
    cfg = profiling.ProfileConfig(warmup_steps=0, steps=1, windows=1)
    with profiling._built("style_transfer_jit", "eval", "cpu", 1, cfg, counted=True) as (_, b):
        assert b == 1 and cls.setting("image_size", "cpu") == 32
    with profiling._built("style_transfer_jit", "eval", "cpu", 1, cfg) as _:
        assert cls.setting("image_size", "cpu") == 96
    assert cls.setting("image_size", "cpu") == 96
