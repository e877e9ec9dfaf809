"""A night's plan: which benchmarks, the run and its jobs, and the jobs sent to the workers.

State machine of a nightly run (rows in the database, so any worker may take the next step)::

    queued → running → detecting ─┬─ nothing alertable ─────────────→ complete | incomplete
                                  └─ regressions → confirmation run → triage → bisect → file

The last job of a run to end moves it to ``detecting`` (a conditional UPDATE, so exactly one
worker does) and its task sends ``night.finish`` (:mod:`workers.night.finish`). Steps are sent
only after the transaction that created their rows has committed.
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date

from service.config import Settings, get_settings
from service.db import session_scope
from service.models import JobStatus
from service.models.base import utcnow
from service.runs import rounds
from service.runs import service as runs
from service.runs.service import BenchmarkSpec
from suite.model_info import TORCHBENCH_PREFIX
from workers.app import queue_for
from workers.enqueue import Observer, Step, send

log = logging.getLogger(__name__)


def _selected(by_name: dict[str, dict], models: Sequence[str] | None) -> list[str]:
    """The names ``models`` (names or patterns) pick from the catalogue, in order; without
    ``models``, the suite's own.

    Raises:
        service.errors.InvalidInput: a name or pattern matches no model.
    """
    from service.errors import InvalidInput

    if not models:
        return sorted(n for n, m in by_name.items() if m.get("suite") != "torchbench")
    names: list[str] = []
    unknown = []
    for pattern in models:
        matched = fnmatch.filter(sorted(by_name), pattern)
        names += [n for n in matched if n not in names]
        if not matched:
            unknown.append(pattern)
    if unknown:
        hint = [
            TORCHBENCH_PREFIX + u for u in unknown if fnmatch.filter(by_name, TORCHBENCH_PREFIX + u)
        ]
        raise InvalidInput(
            f"unknown model(s): {', '.join(unknown)}; see `python -m suite list`"
            + (f" (TorchBench's are named {', '.join(hint)})" if hint else "")
        )
    return names


@dataclass(frozen=True)
class NightPlan:
    """What a night measures, and what it skips with the reason.

    Attributes:
        benchmarks: the benchmarks to measure.
        skipped: ``(benchmark, reason)`` of each benchmark of a model the listing marks
            unavailable (a missing requirement, data that was never downloaded): stored as a
            ``skipped`` job with its reason, so that the night's report says what was not
            measured and why.
    """

    benchmarks: list[BenchmarkSpec]
    skipped: list[tuple[BenchmarkSpec, str]] = field(default_factory=list)


def _expand(
    name: str,
    info: dict,
    *,
    modes: Sequence[str],
    devices: Sequence[str],
    compilers: Sequence[str],
    device_class: str | None,
) -> list[BenchmarkSpec]:
    """The benchmarks of model ``name`` the night asks for and the model offers."""
    specs = []
    for device in devices:
        if device not in info.get("devices", ["cpu"]):
            continue
        for mode in modes:
            if mode not in info.get("modes", ["train", "eval"]):
                continue
            if f"{mode}:{device}" in info.get("not_implemented", []):
                continue  # offered on another device only (TorchBench's metadata, sizes)
            for compiler in compilers:
                if compiler not in info.get("compilers", ["eager", "inductor"]):
                    continue  # e.g. an eager-only TorchScript or quantized model
                specs.append(
                    BenchmarkSpec(
                        model=name,
                        mode=mode,
                        device=device,
                        compiler=compiler,
                        queue=queue_for(device, device_class),
                    )
                )
    return specs


def plan_night(
    catalog: Sequence[dict],
    *,
    models: Sequence[str] | None = None,
    modes: Sequence[str] = ("train", "eval"),
    devices: Sequence[str] = ("cpu",),
    compilers: Sequence[str] = ("eager",),
    device_class: str | None = None,
) -> NightPlan:
    """The benchmarks of a night from the suite catalogue (``python -m suite list --json``),
    and those it skips.

    ``models`` are names or shell-style patterns (``torchbench.hf_*``); without them, the
    suite's own models (TorchBench's are run when named). A model the listing marks
    unavailable (a missing requirement) is not measured into an error: its benchmarks are
    :attr:`NightPlan.skipped` with the listing's reason (and the reason is logged).

    Raises:
        service.errors.InvalidInput: a requested name or pattern matches no model, or nothing
            is left to measure.
    """
    from service.errors import InvalidInput

    by_name = {m["name"]: m for m in catalog}
    shape = {
        "modes": modes,
        "devices": devices,
        "compilers": compilers,
        "device_class": device_class,
    }
    benchmarks, skipped = [], []
    for name in _selected(by_name, models):
        info = by_name[name]
        if info.get("available", True):
            benchmarks += _expand(name, info, **shape)  # type: ignore[arg-type]
            continue
        # A model that did not import offers nothing it could tell: what the night asked for.
        known = info.get("modes") and info.get("devices")
        asked = {"modes": modes, "devices": devices, "compilers": compilers}
        specs = _expand(name, info if known else asked, **shape)  # type: ignore[arg-type]
        reason = str(info.get("reason") or "unavailable (no reason given by the listing)")
        log.warning("%s skipped: %s", name, reason)
        skipped += [(spec, reason) for spec in specs]
    if not benchmarks:
        raise InvalidInput(
            "no benchmark matches the requested models, modes, devices and compilers"
        )
    return NightPlan(benchmarks=benchmarks, skipped=skipped)


def plan(
    catalog: Sequence[dict],
    *,
    models: Sequence[str] | None = None,
    modes: Sequence[str] = ("train", "eval"),
    devices: Sequence[str] = ("cpu",),
    compilers: Sequence[str] = ("eager",),
    device_class: str | None = None,
) -> list[BenchmarkSpec]:
    """The benchmarks a night measures (:func:`plan_night`'s, without the skipped).

    Raises:
        service.errors.InvalidInput: as :func:`plan_night`.
    """
    return plan_night(
        catalog,
        models=models,
        modes=modes,
        devices=devices,
        compilers=compilers,
        device_class=device_class,
    ).benchmarks


def create_night(
    *,
    night: date,
    benchmarks: Sequence[BenchmarkSpec],
    torch_spec: str = "current",
    commit_range: list[dict] | None = None,
    skipped: Sequence[tuple[BenchmarkSpec, str]] = (),
    settings: Settings | None = None,
) -> int:
    """Create the night's run and its jobs (committed); returns the run id.

    ``skipped`` benchmarks get a job too, ended ``skipped`` with their reason at once (never
    sent to a worker, not missing data): the night's report lists them.
    """
    settings = settings or get_settings()
    with session_scope() as session:
        run = runs.create_run(
            session,
            night=night,
            benchmarks=[*benchmarks, *(spec for spec, _ in skipped)],
            torch_spec=torch_spec,
            deadline_s=settings.night_deadline_s,
            commit_range=commit_range,
        )
        reasons = {spec.name: reason for spec, reason in skipped}
        for job in runs.list_jobs(session, run_id=run.id) if reasons else ():
            if job.benchmark in reasons:
                job.status, job.error = JobStatus.SKIPPED, reasons[job.benchmark]
                job.finished_at = utcnow()
        return run.id


def create_nights(
    *,
    night: date,
    torch_spec: str = "current",
    models: Sequence[str] | None = None,
    modes: Sequence[str] = ("train", "eval"),
    compilers: Sequence[str] = ("eager",),
    device_classes: Sequence[str] = ("cpu",),
) -> list[tuple[int, int]]:
    """Create one run per device class (``cpu`` or a GPU class such as ``h100``).

    Returns:
        ``(run_id, benchmarks measured)`` per device class, in order (a run's benchmarks
        skipped at planning have ended jobs of their own: :func:`create_night`).

    Raises:
        service.errors.InvalidInput: a bad torch spec, model or device class.
    """
    from workers.builds.torch_envs import parse_torch_spec
    from workers.night import jobs as benchmarking

    spec = parse_torch_spec(torch_spec)  # a bad spec fails here, before any run exists
    catalog = benchmarking.list_suite()
    created = []
    for device_class in device_classes:
        device = "cpu" if device_class == "cpu" else "cuda"
        planned = plan_night(
            catalog,
            models=models,
            modes=modes,
            devices=[device],
            compilers=compilers,
            device_class=None if device == "cpu" else device_class,
        )
        run_id = create_night(
            night=night, benchmarks=planned.benchmarks, torch_spec=spec, skipped=planned.skipped
        )
        created.append((run_id, len(planned.benchmarks)))
    return created


def dispatch_scheduled(*, night: date | None = None, settings: Settings | None = None) -> list[int]:
    """The beat-scheduled night (no GitHub Actions): create and enqueue tonight's runs from the
    ``schedule_*`` settings. Returns the run ids."""
    settings = settings or get_settings()
    created = create_nights(
        night=night or utcnow().date(),
        torch_spec=settings.schedule_torch_spec,
        models=settings.schedule_models or None,
        modes=settings.schedule_modes,
        device_classes=settings.schedule_device_classes,
    )
    for run_id, _ in created:
        enqueue_jobs(run_id)
    return [run_id for run_id, _ in created]


def queued_jobs(run_id: int) -> list[tuple[int, str, str]]:
    """``(job_id, queue, benchmark)`` of the run's jobs still queued, in id order."""
    with session_scope() as session:
        return [
            (j.id, j.queue, j.benchmark)
            for j in runs.list_jobs(session, run_id=run_id)
            if j.status == JobStatus.QUEUED
        ]


def job_step(job_id: int, queue: str) -> Step:
    """The ``bench.run`` step of one job, on its queue."""
    return Step("bench.run", (job_id,), queue)


def send_job(job_id: int, queue: str, *, observer: Observer | None = None) -> None:
    """Enqueue ``bench.run`` for one job (in the embedded default: run it, and the chain it
    starts, here and now, telling ``observer`` of each step: :func:`workers.enqueue.send`)."""
    send([job_step(job_id, queue)], observer=observer)


def run_queue(run_id: int) -> str:
    """The queue run ``run_id`` measures on (:func:`service.runs.rounds.run_queue`)."""
    with session_scope() as session:
        return rounds.run_queue(session, run_id=run_id)


def job_benchmark(job_id: int) -> str:
    """The benchmark name of job ``job_id`` (``model:mode:device[:compiler]``).

    Raises:
        service.errors.NotFound: no such job.
    """
    with session_scope() as session:
        return runs.get_job(session, job_id).benchmark


def enqueue_jobs(run_id: int) -> None:
    """Send one ``bench.run`` task per queued job of the run.

    Deadlines are not ETA tasks (an ETA beyond the broker's visibility timeout gets redelivered
    over and over on Redis); the periodic ``night.sweep_deadlines`` task checks them instead.
    """
    send(job_steps(run_id))


def job_steps(run_id: int) -> list[Step]:
    """One ``bench.run`` step per queued job of the run, in id order."""
    return [job_step(job_id, queue) for job_id, queue, _ in queued_jobs(run_id)]
