"""The failure-bisection simulation: its counts add up, and the majority of two runs a probe
is what keeps a flaky benchmark from naming a wrong commit."""

from __future__ import annotations

from benchmarks.failure_bisection import main, report


def test_a_deterministic_failure_is_never_misnamed_and_two_runs_outvote_flakes(
    tmp_path, capsys
) -> None:  # type: ignore[no-untyped-def]
    rows = report(400, 7, commits=40, workers=[1], unbuildable=0.05, runs=(1, 2))
    for r in rows:
        shares = (
            r["right"],
            r["wrong"],
            r["inconclusive_holding"],
            r["inconclusive_missing"],
            r["not_reproduced"],
        )
        assert abs(sum(shares) - 1) < 1e-9  # type: ignore[arg-type]
    by = {(r["runs"], r["flaky"], r["comes_back"]): r for r in rows}
    for runs in (1, 2):  # deterministic: the culprit, or a range holding it (unbuildable next)
        exact = by[(runs, 0.0, 0.0)]
        assert exact["wrong"] == 0 and exact["inconclusive_missing"] == 0
        assert exact["not_reproduced"] == 0 and exact["right"] > 0.8  # type: ignore[operator]
    for setting in ((0.2, 0.0), (0.0, 0.2)):  # flaky: fewer wrong names with two runs
        one, two = by[(1, *setting)], by[(2, *setting)]
        assert two["wrong"] < one["wrong"], (one, two)  # type: ignore[operator]
        assert two["inconclusive_missing"] < one["inconclusive_missing"]  # type: ignore[operator]
    main(
        [
            "--trials",
            "20",
            "--commits",
            "12",
            "--workers",
            "2",
            "--json",
            str(tmp_path / "rows.json"),
        ]
    )
    assert "| 2 | 2 | 0% | 0% |" in capsys.readouterr().out
    assert (tmp_path / "rows.json").read_text().startswith("[")


def test_another_failure_in_the_range_names_a_wrong_commit_only_when_counted_as_the_night_s() -> (
    None
):
    rows = report(300, 3, commits=40, workers=[1], unbuildable=0.05, other=5)
    by = {(r["flaky"], r["comes_back"], r["match"]): r for r in rows}
    matched, blind = by[(0.0, 0.0, True)], by[(0.0, 0.0, False)]
    assert matched["wrong"] == 0 and matched["inconclusive_missing"] == 0
    assert blind["wrong"] > 0.05, blind  # type: ignore[operator]
    assert matched["right"] > blind["right"], (matched, blind)  # type: ignore[operator]
