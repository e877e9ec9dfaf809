"""The change cell of `nightbench runs compare`: a ratio, or a signed growth in MiB."""

from __future__ import annotations

from workers.cli.runs import _change


def test_ratio_where_there_is_one_and_a_signed_difference_in_mib_for_growth() -> None:
    assert _change({"ratio": 1.2345, "difference": 2.0, "unit": "ms"}) == "1.234"
    assert _change({"ratio": None, "difference": 3 * 2**20, "unit": "bytes"}) == "+3.0 MiB"
    assert _change({"ratio": None, "difference": -1.5 * 2**20, "unit": "bytes"}) == "−1.5 MiB"
    assert _change({"ratio": None, "difference": None, "unit": "bytes"}) == "—"
