"""The measurement setup of a benchmark process: decided, applied by re-executing, verified, kept."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from service.results.records import machine_fingerprint
from suite import cpu_setup
from suite.cpu_setup import (
    GLIBC_TUNABLES_VALUE,
    JEMALLOC_CONF_VALUE,
    MARKER_ENV,
    SetupUnavailable,
    find_allocator,
    plan_setup,
    setup_label,
)
from tests.suite.helpers import run_record, run_suite

JEMALLOC = find_allocator("jemalloc")
needs_jemalloc = pytest.mark.skipif(JEMALLOC is None, reason="jemalloc is not installed here")


def _setup(record: dict) -> dict:
    return dict(record["environment"]["measurement_setup"])


def test_auto_prefers_jemalloc_then_tcmalloc_then_glibc_tunables(tmp_path: Path) -> None:
    (tmp_path / "libtcmalloc.so.4").write_bytes(b"")
    setup = plan_setup(threads=2, environ={"LD_PRELOAD": "/opt/other.so"}, dirs=[str(tmp_path)])
    assert (setup.allocator, setup.allocator_path) == (
        "tcmalloc",
        str(tmp_path / "libtcmalloc.so.4"),
    )
    assert setup.env["LD_PRELOAD"] == f"{tmp_path / 'libtcmalloc.so.4'}:/opt/other.so"
    assert (setup.env["OMP_NUM_THREADS"], setup.env["MKL_NUM_THREADS"]) == ("2", "2")
    assert "MALLOC_CONF" not in setup.env  # the no-purge setting is jemalloc's, not tcmalloc's
    (tmp_path / "libjemalloc.so.2").write_bytes(b"")
    jemalloc = plan_setup(environ={}, dirs=[str(tmp_path)])
    assert jemalloc.allocator == "jemalloc"
    assert (
        jemalloc.env["MALLOC_CONF"] == JEMALLOC_CONF_VALUE == "dirty_decay_ms:-1,muzzy_decay_ms:-1"
    )
    # A MALLOC_CONF the user set is theirs: kept as it is (the process inherits it), not replaced.
    own = plan_setup(environ={"MALLOC_CONF": "narenas:1"}, dirs=[str(tmp_path)])
    assert "MALLOC_CONF" not in own.env
    glibc = plan_setup(threads=0, environ={}, dirs=[])
    assert (glibc.allocator, glibc.allocator_path) == ("glibc", None)
    assert glibc.env == {"GLIBC_TUNABLES": GLIBC_TUNABLES_VALUE, MARKER_ENV: "glibc"}


def test_a_forced_allocator_that_is_missing_is_refused() -> None:
    with pytest.raises(SetupUnavailable, match="no libjemalloc.so"):
        plan_setup(allocator="jemalloc", environ={}, dirs=[])
    with pytest.raises(SetupUnavailable, match="expected one of auto, jemalloc"):
        plan_setup(allocator="mimalloc", environ={}, dirs=[])
    assert plan_setup(allocator="glibc", environ={}).allocator == "glibc"


def test_reexec_happens_once_and_never_under_the_marker(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, list[str], dict[str, str]]] = []
    monkeypatch.setattr(os, "execve", lambda exe, argv, env: calls.append((exe, argv, env)))
    monkeypatch.delenv(MARKER_ENV, raising=False)
    monkeypatch.delenv(cpu_setup.SETUP_ENV, raising=False)
    monkeypatch.setenv(cpu_setup.ALLOCATOR_ENV, "glibc")
    cpu_setup.reexec_if_needed(threads=1, cpus=None)
    [(exe, argv, env)] = calls
    assert exe == sys.executable and argv == sys.orig_argv
    assert (env[MARKER_ENV], env["GLIBC_TUNABLES"], env["OMP_NUM_THREADS"]) == (
        "glibc",
        GLIBC_TUNABLES_VALUE,
        "1",
    )
    monkeypatch.setenv(MARKER_ENV, "glibc")  # the re-executed process
    cpu_setup.reexec_if_needed(threads=1, cpus=None)
    monkeypatch.delenv(MARKER_ENV)
    cpu_setup.reexec_if_needed(threads=1, cpus=None, enabled=False)  # --no-setup
    monkeypatch.setenv(cpu_setup.SETUP_ENV, "off")
    cpu_setup.reexec_if_needed(threads=1, cpus=None)
    assert len(calls) == 1


def test_a_failed_reexec_measures_as_launched(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuse(exe: str, argv: list[str], env: dict[str, str]) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "execve", refuse)
    monkeypatch.delenv(MARKER_ENV, raising=False)
    monkeypatch.delenv(cpu_setup.SETUP_ENV, raising=False)
    monkeypatch.setenv(cpu_setup.ALLOCATOR_ENV, "glibc")
    cpu_setup.reexec_if_needed(threads=1, cpus=None)
    assert "measurement setup not applied" in capsys.readouterr().err
    assert cpu_setup.setup_in_force()["setup"] == "off"


def test_the_benchmark_process_runs_with_the_setup_and_records_it() -> None:
    proc, record = run_record("steady_alloc", "eval", fixtures=True)
    assert proc.returncode == 0, proc.stderr
    setup = _setup(record)
    assert setup["setup"] == "on" and setup["omp_num_threads"] == setup["mkl_num_threads"] == "1"
    assert setup["thp"] and setup["aslr"] in (0, 1, 2)
    if JEMALLOC is None:  # tcmalloc, or the glibc fallback of a machine without either
        assert setup["requested"] == setup["allocator"] in ("tcmalloc", "glibc")
    else:
        assert (setup["requested"], setup["allocator"]) == ("jemalloc", "jemalloc")
        assert os.path.realpath(setup["allocator_path"]) == os.path.realpath(JEMALLOC)
        assert setup_label(record["environment"]) == "jemalloc"
        assert setup["malloc_conf"] == JEMALLOC_CONF_VALUE  # in force in the process, recorded


@needs_jemalloc
def test_jemalloc_keeps_freed_pages_so_a_step_does_not_fault_them_in_again() -> None:
    # steady_alloc frees what each step allocates. Under jemalloc's defaults its large blocks go
    # back to the kernel at once and are faulted in again by the next step; with the setup's
    # MALLOC_CONF the freed pages are reused.
    proc, kept = run_record("steady_alloc", "eval", "--iterations", "20", fixtures=True)
    assert proc.returncode == 0, proc.stderr
    proc, purged = run_record(
        "steady_alloc",
        "eval",
        "--iterations",
        "20",
        fixtures=True,
        MALLOC_CONF="dirty_decay_ms:10000",
    )  # jemalloc's default decay
    assert proc.returncode == 0, proc.stderr
    assert _setup(purged)["malloc_conf"] == "dirty_decay_ms:10000"  # the user's, kept
    assert setup_label(purged["environment"]) == "jemalloc+MALLOC_CONF"
    no_conf = {"measurement_setup": {**_setup(kept), "malloc_conf": None}}  # an older record
    assert setup_label(no_conf) == "jemalloc defaults"
    assert kept["environment"]["page_faults"]["minor_per_step"] < 64
    assert purged["environment"]["page_faults"]["minor_per_step"] > 1000
    assert machine_fingerprint(kept["environment"], "cpu") != machine_fingerprint(
        purged["environment"], "cpu"
    )


def test_forcing_glibc_maps_no_other_allocator_and_sets_the_tunables() -> None:
    proc, record = run_record(
        "steady_alloc", "eval", fixtures=True, NIGHTBENCH_SUITE_ALLOCATOR="glibc"
    )
    assert proc.returncode == 0, proc.stderr
    setup = _setup(record)
    assert (setup["requested"], setup["allocator"], setup["allocator_path"]) == (
        "glibc",
        "glibc",
        None,
    )
    assert setup["glibc_tunables"] == GLIBC_TUNABLES_VALUE
    assert setup_label(record["environment"]) == "glibc+tunables"


def test_no_setup_measures_as_launched() -> None:
    proc, record = run_record("steady_alloc", "eval", "--no-setup", fixtures=True)
    assert proc.returncode == 0, proc.stderr
    setup = _setup(record)
    assert (setup["setup"], setup["requested"], setup["allocator"]) == ("off", None, "glibc")
    assert setup_label(record["environment"]) == "glibc (off)"


def test_the_record_says_what_is_in_force_not_what_was_asked() -> None:
    # A marker inherited without its environment: no re-exec, nothing preloaded, and so it says.
    proc, record = run_record("steady_alloc", "eval", fixtures=True, **{MARKER_ENV: "jemalloc"})
    assert proc.returncode == 0, proc.stderr
    setup = _setup(record)
    assert (setup["requested"], setup["allocator"], setup["glibc_tunables"]) == (
        "jemalloc",
        "glibc",
        None,
    )


@needs_jemalloc
def test_a_change_of_setup_starts_new_series() -> None:
    _, with_jemalloc = run_record("steady_alloc", "eval", fixtures=True)
    _, with_glibc = run_record(
        "steady_alloc", "eval", fixtures=True, NIGHTBENCH_SUITE_ALLOCATOR="glibc"
    )
    assert machine_fingerprint(with_jemalloc["environment"], "cpu") != machine_fingerprint(
        with_glibc["environment"], "cpu"
    )


def test_a_forced_allocator_that_is_missing_exits_2() -> None:
    if find_allocator("tcmalloc") is not None:
        pytest.skip("tcmalloc is installed here")
    proc = run_suite(
        ["run", "--model", "steady_alloc", "--mode", "eval", "--out", "-"],
        NIGHTBENCH_SUITE_ALLOCATOR="tcmalloc",
    )
    assert proc.returncode == 2 and "NIGHTBENCH_SUITE_ALLOCATOR=tcmalloc" in proc.stderr
