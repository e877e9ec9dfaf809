"""The profile diff: what changed between two profiles of one benchmark, row by row.

A *profile* is a table of one benchmark's step on one build, written by ``python -m suite
profile`` (``suite/profiling.py``): for latency, one row per aten operator (``torch.profiler``'s
``key_averages()``: calls per step, self CPU time per step in µs); for ``cpu_instructions``, one
row per function (callgrind, self instructions per step, paths standardised and the noisy
interpreter functions dropped), and beside it one row per Python function (bytecodes each ran
itself per step, ``sys.settrace``: callgrind does not see Python functions on CPython 3.11),
diffed on its own (:data:`BYTECODE_RULE`; :func:`diff_json`'s ``python``). Each row holds one
value per profiled *window* (a few steps profiled together), and the profile holds the step's
total per window.

Method (the diff ``torch.utils.benchmark``'s ``CallgrindStats.delta`` prints, with a noise
rule): a row's value on each side is the *least* of its windows, as ``timeit`` takes the least
of its repeats (a busy host only ever adds time: a window the scheduler interrupted is slower,
never faster); the step's total is the sum of the rows' values, so the rows add up to it. A
row's change is after − before and its *share* is that change over the step total's change:
the rows of a step that got slower by one new operator read ``share 100%``. A row is kept only
when its change exceeds the noise threshold::

    noise = max(noise_share, the largest change of a row between two profiles of the before
                build, over its step total)
    threshold = max(k × noise × before's step total, floor)

that is, ``k`` times the noise measured between two profiles of the same build (a second
profile of the before build, when given: :func:`measured_noise`), never below the kind's
``noise_share`` (:data:`NOISE_RULES`; the figures measured are in docs/profile.md). Two profiles
of identical builds therefore give no row above the noise. Kept
rows are sorted by the size of their change, largest first; a row absent on one side has
``before`` (or ``after``) 0 and is marked ``new`` (or ``gone``).

Pure: tables in, frozen dataclasses out; no I/O, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from service.errors import InvalidInput
from service.metrics import MetricKind, metric


class RowStatus(StrEnum):
    """How a row of the diff stands between the two profiles."""

    CHANGED = "changed"
    NEW = "new"
    GONE = "gone"


@dataclass(frozen=True)
class NoiseRule:
    """When a row's change is above the noise (module docstring).

    Attributes:
        noise_share: the least noise assumed: the largest change of one row between two
            profiles of the same build, as a fraction of the step's total, measured on a quiet
            run (docs/profile.md); a noise measured beside the diff only raises it.
        k: the multiple of the noise a change must exceed.
        floor: the absolute change a row must exceed, in the profile's unit.
    """

    noise_share: float
    k: float
    floor: float

    def threshold(self, before_total: float, measured: float = 0.0) -> float:
        """The change a row must exceed in a step whose total was ``before_total``, with a
        noise ``measured`` between two profiles of the same build (a fraction of the step)."""
        noise = max(self.noise_share, measured)
        return max(self.k * noise * abs(before_total), self.floor)


NOISE_RULES: dict[MetricKind, NoiseRule] = {
    # Self CPU time (µs per step), least of the windows: on a loaded host one operator strayed
    # by up to 11% of the step between two processes of one build (docs/profile.md).
    MetricKind.TIMED: NoiseRule(noise_share=0.10, k=2.0, floor=5.0),
    # Instructions per step: near-deterministic; what strays is allocator and dict work.
    MetricKind.COUNT: NoiseRule(noise_share=0.001, k=3.0, floor=1000.0),
}
"""The noise rule of each metric kind a profile is made for."""
BYTECODE_UNIT = "bytecodes"
"""The unit of a count profile's Python-level rows (``suite.profiling.BYTECODES``)."""
BYTECODE_RULE = NoiseRule(noise_share=0.001, k=3.0, floor=20.0)
"""The noise rule of a count profile's Python-level rows (bytecodes per step, a deterministic
count: what strays is set iteration order, fixed by the caller's ``PYTHONHASHSEED``); the floor
is about two calls of a small function."""


@dataclass(frozen=True)
class ProfileRow:
    """One operator or function of a profile.

    Attributes:
        name: ``aten::addmm``, or a standardised ``file:function``.
        values: its value per step in each window (µs of self CPU time, or instructions).
        calls: its calls per step (operators), None where not counted (functions).
    """

    name: str
    values: tuple[float, ...]
    calls: float | None = None

    @property
    def value(self) -> float:
        """The least of :attr:`values`: the least disturbed window (0 with none)."""
        return min(self.values) if self.values else 0.0


@dataclass(frozen=True)
class Profile:
    """One benchmark's profile on one build.

    Attributes:
        metric: ``latency`` (operators, µs of self CPU time) or ``cpu_instructions``
            (functions, instructions).
        unit: the rows' unit (``us`` or ``instructions``).
        rows: the rows by name.
        windows: the step's total as recorded per window (the profiler's sum, callgrind's
            total), for reference; the diff uses :attr:`total`.
    """

    metric: str
    unit: str
    rows: Mapping[str, ProfileRow]
    windows: tuple[float, ...] = ()

    @property
    def total(self) -> float:
        """The step's total: the sum of the rows' values."""
        return sum(r.value for r in self.rows.values())


@dataclass(frozen=True)
class DiffRow:
    """One row of the diff, above the noise.

    Attributes:
        name: the operator or function.
        before: its value per step on the first build (least of windows; 0 when absent).
        after: the same on the second build.
        change: ``after − before``.
        share: ``change`` over the step total's change (None when the total did not move).
        status: changed, new (absent before) or gone (absent after).
        calls_before: calls per step before (operators; None for functions or absent).
        calls_after: calls per step after.
    """

    name: str
    before: float
    after: float
    change: float
    share: float | None
    status: RowStatus
    calls_before: float | None = None
    calls_after: float | None = None

    @property
    def relative(self) -> float | None:
        """``change / before``; None when absent before."""
        return self.change / self.before if self.before else None


@dataclass(frozen=True)
class ProfileDiff:
    """What changed between two profiles.

    Attributes:
        metric: the profiles' metric.
        unit: their unit.
        total_before: the step's total on the first build (the sum of its rows).
        total_after: the same on the second build.
        rows: the rows above the noise, largest change first.
        rule: the noise rule they passed.
        noise: the noise measured between two profiles of the before build (fraction of the
            step; 0 when none was given).
        threshold: the change a row had to exceed (profile's unit).
        compared: how many distinct rows the two profiles held.
    """

    metric: str
    unit: str
    total_before: float
    total_after: float
    rows: tuple[DiffRow, ...]
    rule: NoiseRule
    noise: float
    threshold: float
    compared: int

    @property
    def total_change(self) -> float:
        """``total_after − total_before``."""
        return self.total_after - self.total_before

    @property
    def explained(self) -> float | None:
        """The fraction of the step total's change the rows add up to (None: it did not move)."""
        if not self.total_change:
            return None
        return sum(r.change for r in self.rows) / self.total_change

    @property
    def appeared(self) -> tuple[str, ...]:
        """The rows above the noise absent from the first profile."""
        return tuple(r.name for r in self.rows if r.status is RowStatus.NEW)

    @property
    def vanished(self) -> tuple[str, ...]:
        """The rows above the noise absent from the second profile."""
        return tuple(r.name for r in self.rows if r.status is RowStatus.GONE)

    def summary(self) -> str:
        """``the rows explain 97% of the step's change (+412.0 us)``, or ``no row above the
        noise (...)`` when no row was kept."""
        if not self.rows:
            return (
                f"no row above the noise ({self.compared} rows compared, none moved more than "
                f"{self.threshold:,.1f} {self.unit}; the step moved "
                f"{self.total_change:+,.1f} {self.unit})"
            )
        explained = self.explained
        part = "an unmoved step" if explained is None else f"{explained:.0%} of the step's change"
        return f"the rows explain {part} ({self.total_change:+,.1f} {self.unit})"


UNIT_FORMATS: dict[str, str] = {
    "us": "{:,.1f} µs",
    "instructions": "{:,.0f} instr",
    "bytecodes": "{:,.0f} bytecodes",
}
"""How a profile's values print, per unit (a unit not listed: ``{:,.4g} unit``)."""


def format_profile_value(value: float, unit: str, *, signed: bool = False) -> str:
    """A profile's value with its unit: ``1,234.5 µs``, ``3,783,257 instr``; ``signed`` puts
    ``+`` before a positive change."""
    text = UNIT_FORMATS.get(unit, "{:,.4g} " + unit).format(value)
    return f"+{text}" if signed and value > 0 else text


def measured_noise(first: Profile, second: Profile) -> float:
    """The noise between two profiles of the same build: the largest change of one row, over
    the first's step total (0 for an empty step)."""
    total = first.total
    if not total:
        return 0.0
    names = set(first.rows) | set(second.rows)
    return max((abs(_value(second, n) - _value(first, n)) for n in names), default=0.0) / abs(total)


def _value(profile: Profile, name: str) -> float:
    row = profile.rows.get(name)
    return row.value if row else 0.0


def diff_profiles(
    before: Profile,
    after: Profile,
    *,
    repeat: Profile | None = None,
    rule: NoiseRule | None = None,
    top: int | None = None,
) -> ProfileDiff:
    """The rows that moved between two profiles of one benchmark, above the noise.

    Method: module docstring (the least of each row's windows; a row's change against
    ``max(k × noise_share × step, floor)``; shares of the step total's change, as
    ``CallgrindStats.delta`` diffs functions).

    Args:
        before: the first build's profile (the parent, the baseline).
        after: the second build's (the culprit, tonight's).
        repeat: a second profile of the first build, to measure the noise from
            (:func:`measured_noise`); None: the rule's ``noise_share`` alone.
        rule: the noise rule (default: :data:`BYTECODE_RULE` for Python-level rows in
            bytecodes, else the metric kind's, :data:`NOISE_RULES`).
        top: keep at most this many rows (None: all above the noise).

    Returns:
        The diff; its rows sorted by ``|change|``, largest first, ties by name.

    Raises:
        InvalidInput: the profiles are of different metrics or units, or the metric has no
            noise rule.
    """
    for other in (after, *([repeat] if repeat is not None else [])):
        if before.metric != other.metric or before.unit != other.unit:
            raise InvalidInput(
                f"profiles differ: {before.metric} ({before.unit}) against "
                f"{other.metric} ({other.unit})"
            )
    if rule is None and before.unit == BYTECODE_UNIT:
        rule = BYTECODE_RULE
    if rule is None:
        kind = metric(before.metric).kind
        if kind not in NOISE_RULES:
            raise InvalidInput(f"metric {before.metric!r} has no profile noise rule")
        rule = NOISE_RULES[kind]
    total_change = after.total - before.total
    noise = measured_noise(before, repeat) if repeat is not None else 0.0
    threshold = rule.threshold(before.total, noise)
    names = sorted(set(before.rows) | set(after.rows))
    rows: list[DiffRow] = []
    for name in names:
        a, b = before.rows.get(name), after.rows.get(name)
        old, new = (a.value if a else 0.0), (b.value if b else 0.0)
        change = new - old
        if not abs(change) > threshold:
            continue
        status = RowStatus.NEW if a is None else RowStatus.GONE if b is None else RowStatus.CHANGED
        rows.append(
            DiffRow(
                name=name,
                before=old,
                after=new,
                change=change,
                share=change / total_change if total_change else None,
                status=status,
                calls_before=a.calls if a else None,
                calls_after=b.calls if b else None,
            )
        )
    rows.sort(key=lambda r: (-abs(r.change), r.name))
    return ProfileDiff(
        metric=before.metric,
        unit=before.unit,
        total_before=before.total,
        total_after=after.total,
        rows=tuple(rows[:top] if top is not None else rows),
        rule=rule,
        noise=noise,
        threshold=threshold,
        compared=len(names),
    )


def profile_from_json(doc: Mapping[str, Any], *, inclusive: bool = False) -> Profile:
    """A :class:`Profile` from what ``python -m suite profile`` writes.

    The document: ``{"metric", "unit", "totals": [per step, per window], "rows": [{"name",
    "calls", "self": [per step, per window], "inclusive": [...]}]}`` (``inclusive`` for
    functions only).

    Args:
        doc: the parsed JSON document.
        inclusive: read the rows' inclusive values instead of their self values (functions;
            inclusive rows overlap, so their shares do not add up to the step).

    Raises:
        InvalidInput: a field is missing or not numbers.
    """
    try:
        key = "inclusive" if inclusive else "self"
        rows = {}
        for row in doc["rows"]:
            values = tuple(float(v) for v in row[key])
            if not all(math.isfinite(v) for v in values):
                raise ValueError(f"{row['name']}: values must be finite")
            calls = row.get("calls")
            rows[str(row["name"])] = ProfileRow(
                name=str(row["name"]),
                values=values,
                calls=None if calls is None else float(calls),
            )
        return Profile(
            metric=str(doc["metric"]),
            unit=str(doc["unit"]),
            rows=rows,
            windows=tuple(float(v) for v in doc.get("totals") or ()),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInput(f"not a profile document: {exc}") from exc


def python_profile_of(doc: Mapping[str, Any]) -> Profile | None:
    """The Python-level profile in a function profile's document (its ``python`` section, in
    bytecodes), or None when it has none or its section holds an error.

    Raises:
        InvalidInput: the section is there but is not a profile document.
    """
    section = doc.get("python")
    if not isinstance(section, Mapping) or section.get("error"):
        return None
    return profile_from_json(section)


def diff_json(diff: ProfileDiff, *, python: ProfileDiff | None = None) -> dict[str, Any]:
    """The diff as JSON (for ``nightbench profile --json`` and the API); ``python``, the diff
    of the Python-level rows of a count profile, is its ``python`` member (null without)."""
    return {
        "metric": diff.metric,
        "unit": diff.unit,
        "total_before": diff.total_before,
        "total_after": diff.total_after,
        "total_change": diff.total_change,
        "explained": diff.explained,
        "summary": diff.summary(),
        "compared": diff.compared,
        "noise": diff.noise,
        "threshold": diff.threshold,
        "rule": {
            "noise_share": diff.rule.noise_share,
            "k": diff.rule.k,
            "floor": diff.rule.floor,
        },
        "appeared": list(diff.appeared),
        "vanished": list(diff.vanished),
        "rows": [
            {
                "name": r.name,
                "before": r.before,
                "after": r.after,
                "change": r.change,
                "share": r.share,
                "status": str(r.status),
                "calls_before": r.calls_before,
                "calls_after": r.calls_after,
            }
            for r in diff.rows
        ],
        "python": diff_json(python) if python is not None else None,
    }
