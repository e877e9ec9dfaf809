"""A suite record as result rows: the rows both write paths store (pure: no database)."""

from __future__ import annotations

import pytest

from service.errors import InvalidInput
from service.results.records import machine_fingerprint, result_rows, series_key

RECORD = {
    "model": "dcgan",
    "mode": "eval",
    "device": "cpu",
    "batch_size": 4,
    "benchmark_version": "v1",
    "environment": {"torch_version": "2.13.0"},
    "metrics": [
        {"metric": "latency", "unit": "ms", "samples": [3, "3.5"], "median": 3.25},
        {"metric": "cpu_peak_mem", "unit": "bytes", "samples": [2.0**28]},
    ],
}


def test_a_record_gives_one_row_per_metric() -> None:
    latency, memory = result_rows(RECORD, machine=None)
    assert latency["compiler"] == "eager" and latency["samples"] == [3.0, 3.5]
    assert (latency["sample_count"], latency["median"], latency["iqr"]) == (2, 3.25, None)
    assert latency["series_key"] == series_key(
        model="dcgan",
        mode="eval",
        device="cpu",
        compiler="eager",
        metric="latency",
        batch_size=4,
        benchmark_version="v1",
        machine="",
    )
    assert memory["unit"] == "bytes" and memory["error"] is None and memory["machine_id"] is None
    assert latency["environment"] is memory["environment"]
    assert latency["environment"] == RECORD["environment"]
    assert latency["environment"] is not RECORD["environment"]


def test_an_error_record_gives_one_latency_row_without_samples() -> None:
    [row] = result_rows({**RECORD, "error": "Killed"}, machine=None)
    assert (row["metric"], row["unit"], row["samples"], row["sample_count"]) == (
        "latency",
        "ms",
        [],
        0,
    )
    assert (row["error"], row["series_key"], row["median"]) == ("Killed", None, None)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mode": None}, "benchmark record lacks field 'mode'"),
        (
            {"metrics": [{"metric": "latency", "unit": "ms", "samples": []}]},
            "dcgan:eval:cpu: metric 'latency' has no samples",
        ),
        (
            {"metrics": [{"metric": "latency", "samples": [1.0]}]},
            "dcgan:eval:cpu: malformed metric {'metric': 'latency', 'samples': [1.0]}: 'unit'",
        ),
    ],
)
def test_a_bad_record_is_refused_with_its_reason(change: dict, message: str) -> None:
    record = {k: v for k, v in {**RECORD, **change}.items() if v is not None}
    with pytest.raises(InvalidInput) as info:
        result_rows(record, machine=None)
    assert str(info.value) == message


CPU_ENV = {"cpu_model": "Xeon", "threads": 1, "torch_version": "2.13.0"}
JEMALLOC = {
    "setup": "on",
    "requested": "jemalloc",
    "allocator": "jemalloc",
    "allocator_path": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "glibc_tunables": None,
    "malloc_conf": None,
    "omp_num_threads": "1",
    "mkl_num_threads": "1",
    "thp": "madvise",
    "aslr": 2,
}


def test_a_record_without_measurement_setup_keeps_its_stored_fingerprint() -> None:
    # The value machine_fingerprint gave before records carried a measurement setup.
    assert machine_fingerprint(CPU_ENV, "cpu") == "d244c20dde0cedefce2738a996cda630"


@pytest.mark.parametrize(
    "change",
    [
        {"allocator": "glibc", "allocator_path": None},
        {
            "allocator": "glibc",
            "allocator_path": None,
            "glibc_tunables": "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=67108864",
        },
        {"setup": "off"},
        {"malloc_conf": "background_thread:true"},
        {"thp": "always"},
        {"aslr": 0},
    ],
)
def test_a_change_of_measurement_setup_starts_a_new_machine(change: dict) -> None:
    before = machine_fingerprint({**CPU_ENV, "measurement_setup": JEMALLOC}, "cpu")
    after = machine_fingerprint({**CPU_ENV, "measurement_setup": {**JEMALLOC, **change}}, "cpu")
    assert len({before, after, machine_fingerprint(CPU_ENV, "cpu")}) == 3


def test_the_library_path_and_thread_variables_do_not_split_a_machine() -> None:
    moved = {**JEMALLOC, "allocator_path": "/usr/local/lib/libjemalloc.so", "mkl_num_threads": None}
    assert machine_fingerprint(
        {**CPU_ENV, "measurement_setup": JEMALLOC}, "cpu"
    ) == machine_fingerprint({**CPU_ENV, "measurement_setup": moved}, "cpu")


def test_a_count_at_its_count_settings_is_another_series() -> None:
    """A model counted at a smaller image (``count_settings``) counts other work: another
    machine. A count without settings fingerprints as counts always did."""
    counter = {"tool": "callgrind", "valgrind": "valgrind-3.19.0", "flags": ["--x"], "steps": 1}
    plain = machine_fingerprint({**CPU_ENV, "counter": counter}, "cpu")
    assert plain != machine_fingerprint(CPU_ENV, "cpu")
    assert plain == machine_fingerprint({**CPU_ENV, "counter": {**counter, "cpu_s": 4.0}}, "cpu")
    fixed = {**counter, "process_environment": "kept variables, 16384 bytes"}
    assert machine_fingerprint({**CPU_ENV, "counter": fixed}, "cpu") != plain
    small = {**counter, "settings": {"image_size": 32}}
    smaller = {**counter, "settings": {"image_size": 16}}
    assert (
        len(
            {
                plain,
                *(machine_fingerprint({**CPU_ENV, "counter": c}, "cpu") for c in (small, smaller)),
            }
        )
        == 3
    )
