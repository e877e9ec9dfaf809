"""``run_ab`` for real: two commits of a small repository built with the checkout provider and
measured in real processes, with a benchmark command whose figures the commit decides."""

from __future__ import annotations

import subprocess
from pathlib import Path

from workers.ab.run import ABRequest, run_ab
from workers.builds.checkout import CheckoutProvider

BENCH = """import json, os, pathlib, sys

LEVEL = {level}
DISTURBED = {disturbed}  # this side's processes that a busy host slows threefold

count = pathlib.Path(sys.argv[1] + "." + str(LEVEL))
n = int(count.read_text()) if count.exists() else 0
count.write_text(str(n + 1))
value = LEVEL * (3.0 if n in DISTURBED else 1.0) * (1 + 0.0001 * n)
samples = int(os.environ["NIGHTBENCH_SAMPLES"])
print(json.dumps({{"samples": [value] * samples}}))
"""


def _git(path: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(path), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def _repository(path: Path) -> tuple[str, str]:
    """A base whose first two processes are disturbed, and a head 20% slower."""
    path.mkdir()
    _git(path, "init", "-q", "--initial-branch=main")
    _git(path, "config", "user.email", "t@example.org")
    _git(path, "config", "user.name", "T")
    shas = []
    for level, disturbed in ((10.0, (0, 1)), (12.0, ())):
        (path / "bench.py").write_text(BENCH.format(level=level, disturbed=disturbed))
        _git(path, "add", "bench.py")
        _git(path, "commit", "-q", "-m", f"level {level}")
        shas.append(_git(path, "rev-parse", "HEAD"))
    return shas[0], shas[1]


def test_a_change_hidden_by_two_disturbed_processes_is_measured_again_and_found(
    tmp_path: Path,
) -> None:
    base, head = _repository(tmp_path / "repo")
    counter = tmp_path / "count"
    request = ABRequest(base, head, commands=(f"python bench.py {counter}",), processes=6)
    provider = CheckoutProvider(tmp_path / "repo", "", work_dir=tmp_path / "builds")
    lines: list[str] = []
    outcome = run_ab(request, provider, threshold_for=lambda m, b: 0.07, progress=lines.append)

    (row,) = outcome.rows
    # Six a side: the two disturbed base processes leave +20% not significant, so the
    # benchmark is measured with six processes more a side, and the change is then found.
    assert outcome.remeasured == [row.benchmark]
    assert any("measuring 1 unsure benchmark(s) again" in line for line in lines)
    assert row.base_replicates == 12 and row.head_replicates == 12
    assert row.verdict == "regression" and row.p_value is not None and row.p_value < 0.01
    assert row.ratio is not None and 1.19 < row.ratio < 1.21
    assert (tmp_path / "count.10.0").read_text() == "12"


def test_a_build_that_fails_is_the_outcome_not_an_exception(tmp_path: Path) -> None:
    base, head = _repository(tmp_path / "repo")
    request = ABRequest(base, head, commands=("python bench.py x",), processes=2)
    provider = CheckoutProvider(tmp_path / "repo", "exit 3", work_dir=tmp_path / "builds")
    outcome = run_ab(request, provider, threshold_for=lambda m, b: 0.07)
    assert outcome.rows == [] and outcome.failed_side == "base"
    assert outcome.error is not None and outcome.error.startswith(f"the base ({base[:12]})")
