"""Runs: cursor pages, detail with completeness and errors, comparison of two runs."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from fastapi.testclient import TestClient
from scipy.stats import mannwhitneyu
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Run
from service.models.base import utcnow
from service.results.service import store_record
from service.runs.compare import compare_processes, smallest_p_value
from service.runs.service import (
    BenchmarkSpec,
    create_run,
    end_job,
    list_jobs,
    mark_missing,
)
from tests.api.conftest import add_night, make_record, night


def _lat(level: float, seed: int, n: int = 15) -> list[float]:
    return [float(x) for x in np.random.default_rng(seed).normal(level, level * 0.01, n)]


def test_runs_pages_follow_the_cursor(client: TestClient, db: Session) -> None:
    ids = [
        add_night(db, night(i), [make_record("dcgan", "eval", {"latency": _lat(3, i)})]).id
        for i in range(7)
    ]
    seen: list[int] = []
    cursor = None
    pages = 0
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        r = client.get("/api/runs", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        seen += [item["id"] for item in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    mine = [i for i in seen if i in ids]
    assert mine == sorted(ids, reverse=True) and pages >= 3
    assert len(seen) == len(set(seen))
    r = client.get(
        "/api/runs",
        params={"since": night(5).isoformat(), "until": night(6).isoformat(), "kind": "nightly"},
    )
    assert {item["id"] for item in r.json()["items"]} == set(ids[5:])


def test_run_detail_reports_results_errors_and_completeness(
    client: TestClient, db: Session
) -> None:
    specs = [
        BenchmarkSpec(model="dcgan", mode="eval"),
        BenchmarkSpec(model="dcgan", mode="train"),
        BenchmarkSpec(model="unet", mode="eval"),
    ]
    run = create_run(db, night=night(0), benchmarks=specs, deadline_s=1)
    jobs = {j.benchmark: j for j in list_jobs(db, run_id=run.id)}
    store_record(
        db,
        run=run,
        job=jobs["dcgan:eval:cpu"],
        record=make_record("dcgan", "eval", {"latency": _lat(3, 1)}),
    )
    end_job(db, job=jobs["dcgan:eval:cpu"], error=None)
    store_record(
        db,
        run=run,
        job=jobs["dcgan:train:cpu"],
        record=make_record("dcgan", "train", {}, error="Timeout after 900 s"),
    )
    end_job(db, job=jobs["dcgan:train:cpu"], error="Timeout after 900 s")
    db.flush()
    r = client.get(f"/api/runs/{run.id}")
    assert r.status_code == 200, r.text
    body = r.json()
    c = body["completeness"]
    assert (c["total"], c["done"], c["error"], c["queued"]) == (3, 1, 1, 1)
    assert c["pending"] == ["unet:eval:cpu"] and not c["complete"]
    assert c["ended_fraction"] == pytest.approx(2 / 3)
    assert {(x["benchmark"], x["metric"]) for x in body["results"]} == {
        ("dcgan:eval:cpu", "latency"),
        ("dcgan:train:cpu", "latency"),
    }
    assert body["errors"] == [
        {
            "benchmark": "dcgan:train:cpu",
            "source": "result",
            "status": "error",
            "error": "Timeout after 900 s",
        }
    ]
    # Past the deadline the silent benchmark is missing, and says so.
    mark_missing(db, run_id=run.id, now=utcnow() + timedelta(seconds=5))
    db.flush()
    body = client.get(f"/api/runs/{run.id}").json()
    assert body["completeness"]["missing_benchmarks"] == ["unet:eval:cpu"]
    assert [e["benchmark"] for e in body["errors"] if e["source"] == "job"] == ["unet:eval:cpu"]
    assert [a["kind"] for a in body["alerts"]] == ["missing_data"]
    assert client.get("/api/runs/2147483000").json() == {"detail": "run 2147483000 does not exist"}


def _processes(
    db: Session,
    first: int,
    levels: dict[str, float],
    n: int,
    memory: dict[str, float] | None = None,
) -> Run:
    """A night measured in ``n`` processes: a nightly run and ``n - 1`` confirmation re-runs.

    Each process's level moves by ~3% (as processes of one build do here), its 15 iterations by
    1% around it; ``memory`` adds one peak-memory value (bytes) per process.
    """
    rng = np.random.default_rng(first)
    runs = []
    for i in range(n):
        records = [
            make_record(
                model,
                "eval",
                {
                    "latency": _lat(level * float(np.exp(rng.normal(0, 0.03))), first * 100 + i),
                    **(
                        {"cpu_peak_mem": [memory[model] * float(np.exp(rng.normal(0, 0.03)))]}
                        if memory and model in memory
                        else {}
                    ),
                },
            )
            for model, level in levels.items()
        ]
        runs.append(add_night(db, night(first), records, kind="nightly" if i == 0 else "confirm"))
    for child in runs[1:]:
        child.parent_run_id = runs[0].id
    db.flush()
    return runs[0]


def test_compare_flags_a_real_slowdown_only(client: TestClient, db: Session) -> None:
    a = _processes(db, 0, {"dcgan": 3.0, "unet": 8.0, "vit": 5.0}, 5, memory={"dcgan": 4e8})
    b = _processes(db, 1, {"dcgan": 3.6, "unet": 8.0, "centernet": 5.0}, 5, memory={"dcgan": 8e8})
    r = client.get(f"/api/runs/{a.id}/compare/{b.id}")
    assert r.status_code == 200, r.text
    body = r.json()
    rows = {(c["benchmark"], c["metric"]): c for c in body["comparisons"]}
    assert set(rows) == {
        ("dcgan:eval:cpu", "latency"),
        ("dcgan:eval:cpu", "cpu_peak_mem"),
        ("unet:eval:cpu", "latency"),
    }
    slow = rows["dcgan:eval:cpu", "latency"]
    assert (slow["a_processes"], slow["b_processes"], slow["a_samples"]) == (5, 5, 75)
    assert slow["ratio"] == pytest.approx(slow["b_median"] / slow["a_median"])
    assert slow["ratio"] == pytest.approx(1.2, abs=0.05)
    # Every b process above every a process: the smallest p that 5 against 5 can give.
    assert slow["p_value"] == pytest.approx(2 / 252) and slow["verdict"] == "regression"
    memory = rows["dcgan:eval:cpu", "cpu_peak_mem"]
    assert memory["ratio"] == pytest.approx(2.0, abs=0.15) and memory["verdict"] == "regression"
    same = rows["unet:eval:cpu", "latency"]
    assert not same["significant"] and same["verdict"] == "not significant"
    assert body["only_in_a"] == ["vit:eval:cpu latency"]
    assert body["only_in_b"] == ["centernet:eval:cpu latency"]
    assert client.get(f"/api/runs/{a.id}/compare/2147483000").status_code == 404
    assert client.get(f"/api/runs/{a.id}/compare/{b.id}", params={"alpha": 2}).status_code == 422


def test_compare_with_one_process_a_side_says_not_enough_never_a_regression(
    client: TestClient, db: Session
) -> None:
    # Same build, one process each: the second happens to sit 8% higher, its iterations tight.
    # A test on the iterations (15 against 15) would call that a significant regression.
    a = add_night(
        db,
        night(0),
        [make_record("dcgan", "eval", {"latency": _lat(3.0, 1), "cpu_peak_mem": [4.0e8]})],
    )
    b = add_night(
        db,
        night(1),
        [make_record("dcgan", "eval", {"latency": _lat(3.24, 2), "cpu_peak_mem": [8.0e8]})],
    )
    iterations = compare_processes(_lat(3.0, 1), _lat(3.24, 2), alpha=0.01, threshold=0.07)
    assert iterations[3] == "regression", "the trap this test is about: iterations as replicates"
    rows = client.get(f"/api/runs/{a.id}/compare/{b.id}").json()["comparisons"]
    assert {c["metric"] for c in rows} == {"latency", "cpu_peak_mem"}
    for c in rows:
        assert (c["a_processes"], c["b_processes"]) == (1, 1)
        assert c["verdict"] == "not enough processes" and c["p_value"] is None
        assert not c["significant"]


def test_compare_processes_edge_cases() -> None:
    assert compare_processes([5.0] * 5, [5.0] * 5, alpha=0.01, threshold=0.07) == (
        1.0,
        1.0,
        False,
        "not significant",
    )
    ratio, p, significant, verdict = compare_processes(
        [10.0 + i * 0.01 for i in range(6)],
        [8.0 + i * 0.01 for i in range(6)],
        alpha=0.01,
        threshold=0.07,
    )
    assert ratio == pytest.approx(0.8, abs=0.01) and significant and verdict == "improvement"
    separated = ([1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0])
    assert compare_processes(*separated, alpha=0.01, threshold=0.07)[1:] == (
        None,
        False,
        "not enough processes",
    )
    assert compare_processes(*separated, alpha=0.05, threshold=0.07)[3] == "regression"
    with pytest.raises(ValueError, match="at least one process"):
        compare_processes([], [1.0], alpha=0.01, threshold=0.07)


def test_smallest_p_value_is_the_exact_test_s_floor() -> None:
    assert smallest_p_value(1, 1) == 1.0
    assert smallest_p_value(3, 3) == pytest.approx(0.1)
    assert smallest_p_value(5, 5) == pytest.approx(2 / 252)
    # The floor is what scipy's exact test gives when the sides do not overlap at all.
    exact = mannwhitneyu([5, 6, 7, 8], [1, 2, 3, 4], alternative="two-sided", method="exact")
    assert exact.pvalue == pytest.approx(smallest_p_value(4, 4))
    with pytest.raises(ValueError, match="at least one value"):
        smallest_p_value(0, 3)


def _replicates(db: Session, run_id: int) -> list[Run]:
    return list(db.scalars(select(Run).where(Run.parent_run_id == run_id).order_by(Run.id)))


def test_asking_a_run_for_processes_queues_replicate_runs_of_its_build(
    client: TestClient, db: Session, auth: dict[str, str]
) -> None:
    a = _processes(db, 0, {"dcgan": 3.0, "unet": 8.0}, 2)  # the night and one confirmation
    a.torch_spec = "torch==2.13.0"
    failed = add_night(db, night(0), [make_record("vit", "eval", {}, error="crashed")])
    db.flush()
    r = client.post(f"/api/runs/{a.id}/processes", json={"processes": 4}, headers=auth)
    assert r.status_code == 202, r.text
    body = r.json()
    assert {
        b["benchmark"]: (b["measured"], b["queued"], b["added"]) for b in body["benchmarks"]
    } == {"dcgan:eval:cpu": (2, 0, 2), "unet:eval:cpu": (2, 0, 2)}
    assert body["jobs"] == 4 and len(body["runs"]) == 2
    made = [x for x in _replicates(db, a.id) if x.kind == "replicate"]
    assert [x.id for x in made] == body["runs"]
    for child in made:
        assert (child.night, child.torch_spec, child.status) == (a.night, "torch==2.13.0", "queued")
        assert child.options["dispatch"] == "pending"
        assert sorted(j.benchmark for j in list_jobs(db, run_id=child.id)) == [
            "dcgan:eval:cpu",
            "unet:eval:cpu",
        ]
    # Asked again, what is queued counts: nothing more is created.
    again = client.post(f"/api/runs/{a.id}/processes", json={"processes": 4}, headers=auth).json()
    assert again["runs"] == [] and again["jobs"] == 0
    assert {b["queued"] for b in again["benchmarks"]} == {2}
    # Asking for one more adds one process of each benchmark, in one run.
    more = client.post(f"/api/runs/{a.id}/processes", json={"processes": 5}, headers=auth).json()
    assert len(more["runs"]) == 1 and more["jobs"] == 2
    # Bad input is refused, naming what was wrong, and stores nothing.
    before = len(_replicates(db, a.id))
    for run_id, payload, status, words in (
        (a.id, {"processes": 1}, 422, "greater than or equal to 2"),
        (a.id, {"processes": 51}, 422, "less than or equal to 50"),
        (2147483000, {"processes": 3}, 404, "run 2147483000 does not exist"),
        (failed.id, {"processes": 3}, 409, "no result without an error"),
        (made[0].id, {"processes": 3}, 422, "is a replicate run"),
    ):
        r = client.post(f"/api/runs/{run_id}/processes", json=payload, headers=auth)
        assert r.status_code == status and words in r.text, r.text
    assert len(_replicates(db, a.id)) == before and _replicates(db, failed.id) == []
    assert client.post(f"/api/runs/{a.id}/processes", json={"processes": 3}).status_code == 401


def test_replicate_processes_count_in_the_comparison(client: TestClient, db: Session) -> None:
    # One night each, then four more processes each as replicate runs: the verdict is computed.
    a = _processes(db, 0, {"dcgan": 3.0}, 1)
    b = _processes(db, 1, {"dcgan": 3.6}, 1)
    for parent, level, first in ((a, 3.0, 10), (b, 3.6, 20)):
        for i in range(4):
            child = add_night(
                db,
                parent.night,
                [make_record("dcgan", "eval", {"latency": _lat(level, first + i)})],
                kind="replicate",
            )
            child.parent_run_id = parent.id
    db.flush()
    c = client.get(f"/api/runs/{a.id}/compare/{b.id}").json()["comparisons"][0]
    assert (c["a_processes"], c["b_processes"]) == (5, 5)
    assert c["p_value"] == pytest.approx(2 / 252) and c["verdict"] == "regression"


def test_a_confirmation_run_s_rounds_are_processes_of_the_night_s_build(
    client: TestClient, db: Session
) -> None:
    # Night b's re-run measured in two rounds (NIGHTBENCH_NIGHT_PROCESSES=2): the re-run and
    # its round are both processes of b's build; a round of an unrelated run is not.
    a = _processes(db, 0, {"dcgan": 3.0}, 1)
    b = _processes(db, 1, {"dcgan": 3.6}, 1)
    other = _processes(db, 2, {"dcgan": 3.6}, 1)

    def child(parent: Run, kind: str, seed: int) -> Run:
        run = add_night(
            db,
            parent.night,
            [make_record("dcgan", "eval", {"latency": _lat(3.6, seed)})],
            kind=kind,
        )
        run.parent_run_id = parent.id
        run.options = {"origin": "night"}
        return run

    confirm = child(b, "confirm", 30)
    child(confirm, "replicate", 31)
    child(other, "replicate", 32)
    db.flush()
    c = client.get(f"/api/runs/{a.id}/compare/{b.id}").json()["comparisons"][0]
    assert (c["a_processes"], c["b_processes"]) == (1, 3)


def test_growth_is_compared_by_its_difference_not_a_ratio() -> None:
    mib = 2.0**20
    # Growth near zero on one side: a ratio would read x20 for 1.9 MiB more; not a regression.
    small = compare_processes(
        [0.1 * mib + i for i in range(6)],
        [2.0 * mib + i for i in range(6)],
        alpha=0.01,
        threshold=0.07,
        min_difference=8 * mib,
    )
    assert small[0] is None and small[2] and small[3] == "unchanged"
    # Negative growth on one side (pages handed back): still a difference, never a ratio.
    grown = compare_processes(
        [-3.0 * mib + i for i in range(6)],
        [12.0 * mib + i for i in range(6)],
        alpha=0.01,
        threshold=0.07,
        min_difference=8 * mib,
    )
    assert grown[0] is None and grown[3] == "regression"
    shrunk = compare_processes(
        [12.0 * mib + i for i in range(6)],
        [-3.0 * mib + i for i in range(6)],
        alpha=0.01,
        threshold=0.07,
        min_difference=8 * mib,
    )
    assert shrunk[3] == "improvement"


def test_the_api_gives_growth_a_difference_and_no_ratio(client: TestClient, db: Session) -> None:
    a = add_night(
        db,
        night(0),
        [make_record("dcgan", "eval", {"latency": _lat(3.0, 1), "mem_growth": [0.1 * 2**20]})],
    )
    b = add_night(
        db,
        night(1),
        [make_record("dcgan", "eval", {"latency": _lat(3.0, 2), "mem_growth": [2.1 * 2**20]})],
    )
    rows = {
        c["metric"]: c for c in client.get(f"/api/runs/{a.id}/compare/{b.id}").json()["comparisons"]
    }
    assert rows["mem_growth"]["ratio"] is None
    assert rows["mem_growth"]["difference"] == pytest.approx(2 * 2**20)
    assert rows["latency"]["ratio"] is not None
    assert rows["latency"]["difference"] == pytest.approx(
        rows["latency"]["b_median"] - rows["latency"]["a_median"]
    )
