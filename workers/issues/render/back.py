"""The comment telling a regression's issue that its series is back at its level. Pure."""

from __future__ import annotations

from service.models import Regression
from workers.issues.render.markdown import format_change, format_value


def render_back(regression: Regression) -> str:
    """The comment telling an issue that ``regression``'s series is back (Markdown).

    Raises:
        ValueError: the regression is not back (``back_night`` is None).
    """
    if regression.back_night is None:
        raise ValueError(f"regression {regression.id} is not back")
    first = regression.first_night.isoformat() if regression.first_night else "its first night"
    return (
        f"**Back at its level from before this regression on {regression.back_night}**: "
        f"`{regression.benchmark}` {regression.metric} ({format_change(regression.change)} "
        f"against a baseline of {format_value(regression.baseline, regression.unit)}, first "
        f"night {first}).\n\n> {regression.back_reason or ''}\n\n"
        "If the step comes back, it is raised again. Close this issue as completed if a fix or "
        "a revert landed; if nothing did, look at the chart before closing it as not planned.\n"
    )
