"""The real-data detection evaluation (``benchmarks.real_series``) on a slice of its data."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.detection import Flags, evaluate, nightbench_flags
from benchmarks.real_series import (
    DATA,
    build,
    by_direction,
    flat_flags_by_age,
    flat_segments,
    load,
    main,
    night_noise,
    with_reruns,
)
from benchmarks.series import SeriesSet


@pytest.fixture(scope="module")
def quiet_reals():
    """The five quietest latency series of the committed data that have a flat segment."""
    reals = [r for r in load() if not r.memory and flat_segments(r.values)]
    reals.sort(key=lambda r: night_noise(np.log(r.values)))
    return reals[:5]


def test_the_committed_data_holds_hundreds_of_real_series():
    reals = load()
    assert len(reals) >= 300
    assert any(r.memory for r in reals) and any(not r.memory for r in reals)
    assert all(np.nanmin(r.values) > 0 for r in reals)


def test_a_flat_segment_ends_where_a_real_series_steps():
    rng = np.random.default_rng(3)
    values = np.exp(rng.normal(0, 0.01, 300))
    values[150:] *= 1.3
    values[[40, 41, 200]] = np.nan
    segs = flat_segments(values)
    assert len(segs) == 2
    assert abs(segs[0][1] - 150) <= 8 and abs(segs[1][0] - 150) <= 8
    assert segs[1][1] == 300 - 7  # the last nights, which no centred median covers, are out


def test_a_planted_step_in_real_noise_is_found_within_three_nights(quiet_reals):
    lab = build(quiet_reals, seed=4, replicas=2, sizes=(0.20, -0.50))
    s = lab.s
    step = s.category == "step"
    assert step.sum() == 2 * 2 * (s.category == "flat").sum()
    # the planted copy is the flat segment times 1 + size from its event night on
    flat_row = np.nonzero(s.category == "flat")[0][0]
    row = flat_row + 1
    e = s.event_night[row]
    np.testing.assert_allclose(s.levels[row, e:], s.levels[flat_row, e:] * 1.2)
    np.testing.assert_array_equal(s.levels[row, :e], s.levels[flat_row, :e])
    result = evaluate(s, nightbench_flags(s, True), online=True)
    assert result["recall_>=10%_within_3_nights"] == 1.0
    assert result["false_alarms_per_100_series_nights_no_change"] == 0.0


def test_the_script_writes_its_figures_from_a_data_slice(tmp_path, quiet_reals, capsys):
    with gzip.open(DATA, "rt") as fh:
        doc = json.load(fh)
    names = {r.name for r in quiet_reals}
    for h in doc["histories"]:
        key = f"{h['source']}:{h['machine']}:{h['env']}:"
        h["series"] = {b: v for b, v in h["series"].items() if key + b in names}
    data = tmp_path / "slice.json.gz"
    with gzip.open(data, "wt") as fh:
        json.dump(doc, fh)
    out = tmp_path / "real.json"
    assert main(["--data", str(data), "--seed", "2", "--replicas", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["real_series"] == len(quiet_reals)
    online = result["nightbench online"]
    assert online["recall_by_step_size"]["0.5"]["within_3_nights"] == 1.0
    assert set(online["by_noise"]) <= {"sigma<1%", "sigma 1-3%", "sigma 3-10%", "sigma>=10%"}
    assert (
        online["by_direction"]["regressions"]["flags"]
        + online["by_direction"]["improvements"]["flags"]
        == online["flags"]
    )
    assert online["regressions: precision, false alarms / 100"] == [
        online["by_direction"]["regressions"]["precision"],
        online["by_direction"]["regressions"]["false_alarms_per_100_series_nights_no_change"],
    ]
    assert json.loads(capsys.readouterr().out) == result


def test_unreadable_data_is_exit_code_2(tmp_path):
    assert main(["--data", str(tmp_path / "missing.json.gz")]) == 2
    bad = tmp_path / "bad.json.gz"
    with gzip.open(bad, "wt") as fh:
        json.dump({"series": []}, fh)
    assert main(["--data", str(bad)]) == 2
    assert Path(DATA).is_file()


def _one_series(levels: list[float], event: int = -1, size: float = 0.0) -> SeriesSet:
    lv = np.array([levels])
    return SeriesSet(
        levels=lv,
        memory=np.array([False]),
        expected=np.zeros(lv.shape, dtype=bool),
        category=np.array(["step" if event >= 0 else "flat"]),
        cv=np.zeros(1),
        samples=np.zeros(1, dtype=int),
        event_night=np.array([event]),
        event_end=np.array([event]),
        event_size=np.array([size]),
    )


def test_a_rerun_follows_each_candidate_night_and_draws_from_the_segment():
    base = [100.0, 101.0, 99.0, 100.0, 100.5, 99.5] * 5
    flat = _one_series(base[:20] + [120.0] + base[20:])  # night 20: +20%, a candidate
    levels, rerun, night = with_reruns(flat, seed=0)
    assert rerun.sum() == 1 and rerun[0, 21] and night[0, 21] == 20 and night[0, 22] == 21
    assert levels[0, 21] in set(base)  # another night's level, not the candidate's 120
    # A planted +50% step: the re-run of a night after it carries the step.
    stepped = _one_series(base + [150.0] * 5, event=30, size=0.5)
    levels, rerun, night = with_reruns(stepped, seed=0)
    first = int(np.flatnonzero(rerun[0])[0])
    assert night[0, first] == 30 and levels[0, first] >= 99.0 * 1.5
    # No candidate, no re-run; the columns are the nights.
    levels, rerun, night = with_reruns(_one_series(base), seed=0)
    assert not rerun.any() and list(night[0]) == list(range(len(base)))
    # Drawn from the next night: the host's next measurement, whatever it was.
    excursion = base[:20] + [120.0, 118.0] + base[20:]
    levels, rerun, night = with_reruns(_one_series(excursion), seed=0, draw="next")
    assert rerun.sum() == 2 and rerun[0, 21] and levels[0, 21] == 118.0
    assert rerun[0, 23] and night[0, 23] == 21 and levels[0, 23] == excursion[22]
    with pytest.raises(ValueError, match="draw"):
        with_reruns(flat, seed=0, draw="same")


def test_a_paired_rerun_carries_the_build_s_change_not_the_host_s():
    base = [100.0, 101.0, 99.0, 100.0, 100.5, 99.5] * 5
    # A two-night excursion of the host (+20%, +18%): beside the previous build, no change.
    levels, rerun, _ = with_reruns(
        _one_series(base[:20] + [120.0, 118.0] + base[20:]), seed=0, draw="paired"
    )
    assert rerun.sum() == 2
    assert all(98.0 <= v <= 102.0 for v in levels[0][rerun[0]])  # the baseline, +-1 night's noise
    # A planted +50% step: on its first night the build moved (the pair shows +50%); the step's
    # later candidate nights are paired with a build that already holds it (the pair shows 0).
    stepped = _one_series(base + [150.0] * 5, event=30, size=0.5)
    for draw, spread in (("paired", 0.02), ("paired-2n", 0.04)):
        levels, rerun, night = with_reruns(stepped, seed=0, draw=draw)
        paired = levels[0][rerun[0]]
        assert night[0][rerun[0]][0] == 30 and 150.0 * (1 - spread) <= paired[0] <= 151.0 * (
            1 + spread
        ), paired
        assert all(v <= 101.0 * (1 + spread) for v in paired[1:]), paired


def test_flags_are_scored_by_direction_and_flat_flags_by_the_night_s_age():
    base = [100.0, 101.0, 99.0, 100.0, 100.5, 99.5] * 10  # 60 nights
    step = _one_series(base[:40] + [v * 1.3 for v in base[40:]], event=40, size=0.3)
    flat = _one_series(base)
    s = SeriesSet(
        **{
            k: np.concatenate([getattr(step, k), getattr(flat, k)])
            for k in SeriesSet.__dataclass_fields__
        }
    )
    # Series 0: the step found (a true regression), then a false improvement on it.
    # Series 1 (flat): a false regression on night 10 (young) and one on night 50, and a false
    # improvement on night 45.
    f = Flags(
        series=np.array([0, 0, 1, 1, 1]),
        night=np.array([40, 50, 10, 50, 45]),
        raised=np.array([41, 51, 11, 51, 46]),
        up=np.array([True, False, True, True, False]),
    )
    d = by_direction(s, f)
    assert d["regressions"]["flags"] == 3 and d["improvements"]["flags"] == 2
    assert d["regressions"]["precision"] == round(1 / 3, 4)
    assert d["improvements"]["precision"] == 0.0
    # No-change nights: the flat series' 60; two false regressions and one false improvement.
    assert d["regressions"]["false_alarms_per_100_series_nights_no_change"] == round(
        2 / 60 * 100, 4
    )
    assert d["improvements"]["false_alarms_per_100_series_nights_no_change"] == round(
        1 / 60 * 100, 4
    )
    age = flat_flags_by_age(s, f, young=30)
    assert age["first 30 nights"] == {
        "nights": 30,
        "regressions": 1,
        "improvements": 0,
        "per_100_series_nights": round(1 / 30 * 100, 4),
    }
    assert age["later"] == {
        "nights": 30,
        "regressions": 1,
        "improvements": 1,
        "per_100_series_nights": round(2 / 30 * 100, 4),
    }
