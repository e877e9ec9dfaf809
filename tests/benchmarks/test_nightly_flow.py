"""The noise model of benchmarks/nightly_flow.py: processes per night, rounds, the old draws."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.nightly_flow import (
    ALL_CASES,
    Noise,
    Outcome,
    case_levels,
    cell_seed,
    main,
    parse_args,
    run_series,
)
from service.regressions.detection import DetectorParams, Night, assess_night, confirm


def _old_run_series(
    levels: np.ndarray,
    rerun_levels: np.ndarray,
    event: int,
    rng: np.random.Generator,
    cv: float,
    params: DetectorParams,
) -> Outcome:
    """The flow as it was before processes per night: one draw of N(0, cv) a night."""
    history: list[Night] = []
    alert: int | None = None
    false_alerts = reruns = 0
    for i, (level, again) in enumerate(zip(levels, rerun_levels, strict=True)):
        tonight = Night(night=i, samples=(float(level * np.exp(rng.normal(0, cv))),))
        a = assess_night(history, tonight, metric="latency", params=params)
        history.append(tonight)
        raised = a.verdict == "regression" and a.confirmed
        if a.verdict == "regression" and not a.confirmed:
            rerun = Night(night=i, samples=(float(again * np.exp(rng.normal(0, cv))),), rerun=True)
            c = confirm(history[:-1], tonight, rerun, metric="latency", params=params)
            history.append(rerun)
            raised = c.verdict == "regression"
            reruns += i < event
        if raised:
            if i >= event and alert is None:
                alert = i - event
            elif i < event:
                false_alerts += 1
    return Outcome(alert, false_alerts, len(levels), reruns)


def _night_levels(noise: Noise, nights: int, seed: int) -> np.ndarray:
    """Log of the levels (medians of the samples) of ``nights`` nights at level 1."""
    rng = np.random.default_rng(seed)
    return np.log([np.median(noise.draw(1.0, rng)) for _ in range(nights)])


def test_one_process_without_rounds_draws_what_the_old_model_drew() -> None:
    noise = Noise(process_cv=0.03)
    new, old = np.random.default_rng([1, 300, 4]), np.random.default_rng([1, 300, 4])
    for level in (1.0, 1.1, 0.9, 1.0, 1.2):
        assert noise.draw(level, new) == (float(level * np.exp(old.normal(0, 0.03))),)


@pytest.mark.parametrize("case", [("flat", 0.0), ("blip", 0.3), ("step", 0.10)])
@pytest.mark.parametrize("cv", [0.03, 0.05])
def test_one_process_without_rounds_gives_the_old_outcomes(
    case: tuple[str, float], cv: float
) -> None:
    noise, params = Noise(process_cv=cv), DetectorParams(max_run=7)
    seed = cell_seed(1, noise, case)
    assert seed == [1, round(cv * 1e4), ALL_CASES.index(case)]  # the tables' seeds
    new, old = np.random.default_rng(seed), np.random.default_rng(seed)
    for _ in range(6):
        levels, again, event = case_levels(*case, baseline=8, after=7, flat_nights=40)
        got = run_series(levels, again, event, new, noise, params)
        assert got == _old_run_series(levels, again, event, old, cv, params)
    assert new.normal() == old.normal()  # the same number of draws, to the last


def test_a_night_holds_one_sample_per_process() -> None:
    rng = np.random.default_rng(5)
    for k in (1, 3, 5):
        samples = Noise(process_cv=0.03, round_cv=0.05, processes=k).draw(2.0, rng)
        assert len(samples) == k
        assert len(set(samples)) == k
        assert all(1.0 < s < 4.0 for s in samples)


def test_more_processes_in_their_own_rounds_steady_the_night_level() -> None:
    # the two parts measured on this host's noisier run (docs/benchmarks.md)
    sd = {k: float(np.std(_night_levels(Noise(0.0341, 0.057, k), 4000, seed=k))) for k in (1, 3, 5)}
    total = float(np.hypot(0.0341, 0.057))
    assert sd[1] == pytest.approx(total, rel=0.08)
    assert sd[3] < 0.8 * sd[1]  # the median of 3 normals: about 0.67 of one
    assert sd[5] < 0.9 * sd[3]  # of 5: about 0.54 of one


def test_processes_sharing_one_round_keep_the_rounds_noise() -> None:
    apart = float(np.std(_night_levels(Noise(0.0341, 0.057, 5), 4000, seed=7)))
    together = float(np.std(_night_levels(Noise(0.0341, 0.057, 5, same_round=True), 4000, seed=7)))
    assert together > 0.9 * 0.057  # the round's draw is not averaged away
    assert together > 1.2 * apart


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"process_cv": 0.03, "processes": 0}, "--processes"),
        ({"process_cv": -0.01}, "--process-cv"),
        ({"process_cv": 0.03, "round_cv": -0.02}, "--round-cv"),
        ({"process_cv": 0.03, "round_cv": float("nan")}, "--round-cv"),
    ],
)
def test_an_invalid_noise_names_its_option(kwargs: dict[str, float], option: str) -> None:
    with pytest.raises(ValueError, match=option):
        Noise(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["--processes", "0"], "--processes"),
        (["--processes", "3", "-1"], "--processes"),
        (["--round-cv", "-0.05"], "--round-cv"),
        (["--process-cv", "0.03", "-0.01"], "--process-cv"),
        (["--cv", "-0.03"], "--cv"),
        (["--round-cv", "0.05", "0.02", "--process-cv", "0.03", "0.03", "0.03"], "--round-cv"),
    ],
)
def test_invalid_options_exit_with_a_message_naming_the_option(
    argv: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert option in capsys.readouterr().err


def test_options_pair_round_and_process_noise_for_each_k() -> None:
    args = parse_args(
        [
            "--round-cv",
            "0.057",
            "0.0202",
            "--process-cv",
            "0.0341",
            "0.0286",
            "--processes",
            "1",
            "3",
            "--steps",
            "0.1",
        ]
    )
    assert [(n.round_cv, n.process_cv, n.processes) for n in args.noises] == [
        (0.057, 0.0341, 1),
        (0.0202, 0.0286, 1),
        (0.057, 0.0341, 3),
        (0.0202, 0.0286, 3),
    ]
    assert args.cases == [("flat", 0.0), ("blip", 0.3), ("step", 0.1)]
    plain = parse_args([])
    assert [(n.round_cv, n.process_cv, n.processes) for n in plain.noises] == [
        (0.0, 0.01, 1),
        (0.0, 0.03, 1),
        (0.0, 0.05, 1),
    ]


def test_a_large_step_on_a_quiet_host_is_alerted_in_every_trial() -> None:
    rows = main(
        [
            "--trials",
            "3",
            "--cv",
            "0.01",
            "--max-run",
            "7",
            "--steps",
            "0.3",
            "--processes",
            "3",
            "--round-cv",
            "0.01",
        ]
    )
    step = [r for r in rows if r["case"] == "step"]
    assert len(rows) == 3 and len(step) == 1
    assert step[0]["processes"] == 3 and step[0]["round_cv"] == 0.01
    assert step[0]["by3"] == 1.0 and step[0]["never"] == 0.0
