"""Instruction counts (``suite/counting.py``): dumps matched to benchmarks, and a real count."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from suite import counting

ROOT = Path(__file__).resolve().parents[2]


def _dump(path: Path, ir: int) -> Path:
    path.write_text(
        "# callgrind format\nversion: 1\ncreator: callgrind-3.19.0\npositions: line\n"
        f"events: Ir\nsummary: {ir}\n\nfn=(1) main\n0 {ir}\n\ntotals: {ir}\n"
    )
    return path


def test_dump_totals_reads_callgrinds_totals(tmp_path: Path) -> None:
    assert counting.dump_totals(_dump(tmp_path / "callgrind.out.1", 7_703_345)) == 7_703_345
    (tmp_path / "x").write_text("not a profile\n")
    with pytest.raises(ValueError, match="not a callgrind profile"):
        counting.dump_totals(tmp_path / "x")


def test_parse_benchmarks_names_what_is_wrong() -> None:
    assert counting.parse_benchmarks("resnet18:eval, sac:train:8") == [
        ("resnet18", "eval", None),
        ("sac", "train", 8),
    ]
    with pytest.raises(ValueError, match="'sac:fit' is not MODEL:train"):
        counting.parse_benchmarks("sac:fit")
    with pytest.raises(ValueError, match="batch size must be >= 1"):
        counting.parse_benchmarks("sac:eval:0")
    with pytest.raises(ValueError, match="no benchmark"):
        counting.parse_benchmarks(" , ")


def test_records_match_dumps_in_order_and_say_what_was_not_counted(tmp_path: Path) -> None:
    cfg = counting.CountConfig(warmup_steps=1, steps=2, repeats=2)
    dumps = [_dump(tmp_path / f"callgrind.out.{i}", ir) for i, ir in enumerate([200, 202, 90], 1)]
    counted = [
        {"model": "a", "mode": "eval", "batch_size": 4, "dumps": 2, "benchmark_version": "v"},
        {"model": "b", "mode": "train", "batch_size": 2, "dumps": 0, "error": "RuntimeError: x"},
        {"model": "c", "mode": "eval", "batch_size": 1, "dumps": 1, "benchmark_version": "w"},
    ]
    counted[0]["settings"] = {"image_size": 32}  # counted at its count_settings
    benchmarks = [("a", "eval", None), ("b", "train", None), ("c", "eval", None), ("d", "eval", 3)]
    records = counting._records(benchmarks, counted, dumps, {"cpu_model": "x"}, cfg, "timed out")
    a, b, c, d = records
    assert a["error"] is None and a["batch_size"] == 4
    assert a["environment"]["counter"]["settings"] == {"image_size": 32}
    assert "settings" not in c["environment"]["counter"]
    assert a["metrics"][0]["metric"] == "cpu_instructions"
    assert a["metrics"][0]["samples"] == [100.0, 101.0]  # per step: each window held 2 steps
    assert b["error"] == "RuntimeError: x" and b["metrics"] == []
    assert c["error"] == "counted 1 of 2 windows: timed out"
    assert d["error"] == "not counted: timed out" and d["measures"] == ["cpu_instructions"]


def _skipped_count(path: Path) -> str:
    """``python -m suite count`` of dqn eval with only ``path`` on PATH: the reason the count
    was skipped (the record must carry no error and no metric)."""
    out = path / "out.json"
    proc = subprocess.run(
        [sys.executable, "-m", "suite", "count", "--benchmarks", "dqn:eval", "--out", str(out)],
        cwd=ROOT,
        env={"PATH": str(path), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    (record,) = json.loads(out.read_text())["records"]
    assert record["error"] is None and record["metrics"] == []
    return str(record["skipped"]["cpu_instructions"])


def test_without_valgrind_the_metric_is_skipped_with_its_reason(tmp_path: Path) -> None:
    with pytest.raises(counting.CountUnavailable, match="valgrind is not installed"):
        counting.valgrind_version(str(tmp_path / "no-valgrind"))
    assert "valgrind is not installed" in _skipped_count(tmp_path)


def test_instrumentation_cannot_be_switched_on_outside_valgrind() -> None:
    # This process is no valgrind process: callgrind_control finds no callgrind task in it.
    with pytest.raises(counting.CountUnavailable, match="callgrind_control -i on failed"):
        counting.instrumentation_on(timeout_s=60)


def test_without_callgrind_control_the_metric_is_skipped_with_its_reason(tmp_path: Path) -> None:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        pytest.skip("valgrind is not installed here")
    # valgrind (Debian's is a script that runs valgrind.bin beside it), no callgrind_control
    for name in ("valgrind", "valgrind.bin"):
        found = shutil.which(name) or str(Path(valgrind).with_name(name))
        if Path(found).exists():
            (tmp_path / name).symlink_to(found)
    assert "callgrind_control is not installed" in _skipped_count(tmp_path)


def _footprint(env: dict[str, str]) -> int:
    return sum(len(f"{k}={v}".encode()) + 1 + 8 for k, v in env.items())


def test_the_count_process_starts_with_a_fixed_environment(tmp_path: Path) -> None:
    """What a worker's shell or deployment adds never reaches the count process (it moved
    counts by up to 0.39%), and the environment it gets is always the same size."""
    base = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/root",
        "PYTHONPATH": "/work/overlay",
        "NIGHTBENCH_SUITE_EXTRA_MODELS": "/work/models",
        "NIGHTBENCH_TORCHBENCH_PATH": "/work/benchmark",
        "TORCH_SHOW_CPP_STACKTRACES": "1",
        "OMP_NUM_THREADS": "8",
    }
    noisy = {
        **base,
        "SSH_CONNECTION": "10.0.0.1 5 10.0.0.2 22",
        "NIGHTBENCH_GITHUB_TOKEN": "ghp_secret",
        "NIGHTBENCH_DATABASE_URL": "postgresql://nightbench@db/nightbench",
        "BIG": "x" * 3000,
        counting.COUNT_ENV_PAD: "stale",
    }
    manifest = tmp_path / "manifest.json"
    env = counting.count_environment(base, manifest)
    assert counting.count_environment(noisy, manifest) == env
    assert list(env) == sorted(env)
    assert {k: env[k] for k in base if k != "OMP_NUM_THREADS"} == {
        k: v for k, v in base.items() if k != "OMP_NUM_THREADS"
    }
    assert env["OMP_NUM_THREADS"] == "1" and env["MKL_NUM_THREADS"] == "1"
    assert env["PYTHONHASHSEED"] == "0" and env[counting.INSIDE_ENV] == str(manifest)
    assert _footprint(env) == counting.COUNT_ENV_BYTES
    longer = counting.count_environment({**base, "PATH": "/opt/build/venv/bin:/usr/bin"}, manifest)
    assert _footprint(longer) == counting.COUNT_ENV_BYTES
    assert len(longer[counting.COUNT_ENV_PAD]) == len(env[counting.COUNT_ENV_PAD]) - 15


def test_an_environment_over_the_padded_size_is_kept_whole(tmp_path: Path) -> None:
    huge = {"PYTHONPATH": "/p" * counting.COUNT_ENV_BYTES}
    env = counting.count_environment(huge, tmp_path / "manifest.json")
    assert env["PYTHONPATH"] == huge["PYTHONPATH"] and env[counting.COUNT_ENV_PAD] == ""
