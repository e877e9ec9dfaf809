"""A missing-data issue's Markdown and the comment telling it that data came. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from workers.issues.model import Arrival, MissingDataReport, RenderedIssue
from workers.issues.trackers.markers import marker, run_marker


def render_missing_data(
    report: MissingDataReport, *, fingerprint: str, labels: Sequence[str]
) -> RenderedIssue:
    """The issue for the benchmarks of one machine class and night that never reported.

    Args:
        report: the run, the machine class and its missing jobs.
        fingerprint: the issue's fingerprint (its hidden marker).
        labels: the issue's labels.
    """
    run, queue, missing = report.run, report.queue, report.jobs
    rows = "\n".join(
        f"| `{j.benchmark}` | {j.worker or 'never taken'} | {j.attempts} | "
        f"{(j.error or '').splitlines()[0] if j.error else ''} |"
        for j in missing
    )
    deadline = f"{run.deadline_at:%Y-%m-%d %H:%M} UTC" if run.deadline_at else "no deadline"
    body = (
        f"**{len(missing)} benchmark(s) of night {run.night} on `{queue}` never reported** "
        f"by the run's deadline ({deadline}, run {run.id}, "
        f"build `{run.torch_spec}`). The night was judged on what came; these series have "
        f"no point for it, so a regression there would go unseen.\n\n"
        f"| benchmark | last worker | attempts | last error |\n| --- | --- | --- | --- |\n"
        f"{rows}\n\n"
        f"What to do: check that a worker serves `{queue}` (`nightbench status` lists the "
        f"workers seen in the last hour), then measure these again with `nightbench "
        f"dispatch --date {run.night} --torch '{run.torch_spec}' --models "
        f"{','.join(sorted({j.model for j in missing}))}`.\n\n"
        f"{marker(fingerprint)}\n{run_marker(run.id)}\n"
    )
    title = (
        f"Missing data: {len(missing)} benchmark(s) of night {run.night} on {queue} never reported"
    )
    return RenderedIssue(title=title, body=body, labels=tuple(labels), fingerprint=fingerprint)


def render_arrival(arrival: Arrival) -> str:
    """The comment telling a missing-data issue that data came (Markdown)."""
    listed = ", ".join(f"`{b}`" for b in arrival.arrived)
    rest = (
        f" Still missing: {', '.join(f'`{b}`' for b in arrival.still)}."
        if arrival.still
        else " Nothing of this night on this machine class is missing any more."
    )
    return (
        f"**Data arrived** for {len(arrival.arrived)} benchmark(s) of night {arrival.night} on "
        f"`{arrival.queue}`: {listed}. Stored for their series; the night was judged without "
        f"them, so a regression in them shows from the next night on.{rest}"
    )
