"""The settings: a refused ``NIGHTBENCH_*`` value is said in one line naming the variable, the
value given and what was wrong; commit links follow the configured source repository."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from service.config import Settings, get_settings, settings_with, use_settings
from service.errors import InvalidSettings


@pytest.fixture(autouse=True)
def _fresh_settings() -> Iterator[None]:
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def refused(monkeypatch: pytest.MonkeyPatch, **variables: str) -> tuple[str, ...]:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(InvalidSettings) as error:
        get_settings()
    assert error.value.message == "\n".join(error.value.lines)
    return error.value.lines


@pytest.mark.parametrize(
    ("variable", "value", "line"),
    [
        (
            "NIGHTBENCH_AB_METRICS",
            '["bogus"]',
            """NIGHTBENCH_AB_METRICS='["bogus"]' refused: unknown bogus; one or more of latency""",
        ),
        (
            "NIGHTBENCH_AB_METRICS",
            "bogus",
            "NIGHTBENCH_AB_METRICS='bogus' refused: must be a JSON list, "
            'e.g. ["latency", "cpu_peak_mem"] (Expecting value',
        ),
        (
            "NIGHTBENCH_THRESHOLD",
            "abc",
            "NIGHTBENCH_THRESHOLD='abc' refused: Input should be a valid number",
        ),
        (
            "NIGHTBENCH_NIGHT_PROCESSES_BY_QUEUE",
            '{"cpu": 0}',
            """NIGHTBENCH_NIGHT_PROCESSES_BY_QUEUE='{"cpu": 0}' refused: cpu: Input should be """
            "greater than or equal to 1",
        ),
        (
            "NIGHTBENCH_BISECT_PROVIDER",
            "docker",
            "NIGHTBENCH_BISECT_PROVIDER='docker' refused: String should match pattern",
        ),
        # The validator's message names its variable and the value: it is the line.
        (
            "NIGHTBENCH_NIGHT_PROCESSES",
            "abc",
            "NIGHTBENCH_NIGHT_PROCESSES must be a whole number of processes per benchmark per "
            "night, 1 or more (1: one process a night), got 'abc'",
        ),
        # A rule across settings names the variables and their values.
        (
            "NIGHTBENCH_SUITE_TIMEOUT_S",
            "5000",
            "NIGHTBENCH_SUITE_TIMEOUT_S (5000) must be below NIGHTBENCH_TASK_SOFT_TIME_LIMIT_S "
            "(1800)",
        ),
    ],
)
def test_a_refused_value_is_one_line_naming_the_variable_and_the_value(
    variable: str, value: str, line: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    [said] = refused(monkeypatch, **{variable: value})
    assert said.startswith(line), said
    assert "\n" not in said and "Traceback" not in said


def test_each_refused_variable_has_its_line(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = refused(monkeypatch, NIGHTBENCH_THRESHOLD="abc", NIGHTBENCH_BISECT_WORKERS="0")
    assert [line.split("=")[0] for line in lines] == [
        "NIGHTBENCH_THRESHOLD",
        "NIGHTBENCH_BISECT_WORKERS",
    ]


def test_the_variable_is_found_whatever_its_case(monkeypatch: pytest.MonkeyPatch) -> None:
    [said] = refused(monkeypatch, nightbench_threshold="abc")
    assert said.startswith("NIGHTBENCH_THRESHOLD='abc' refused:")


def test_settings_built_in_code_still_raise_pydantics_error() -> None:
    with pytest.raises(ValidationError, match="threshold"):
        Settings(threshold=-1)


# ----- the source repository of commit links ----------------------------------------------------


def test_links_go_to_pytorch_only_where_commits_are_read_from_github(tmp_path: Path) -> None:
    assert Settings().source_code_url == "https://github.com/pytorch/pytorch"
    # A local clone without its GitHub address: bare shas, not links to another project.
    assert Settings(source_repo_path=tmp_path).source_code_url is None
    assert Settings(source_repo_path=tmp_path).source_repository is None


def test_a_configured_source_repository_is_linked_and_an_empty_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = Settings(source_repo_path=tmp_path, source_github_repository="example/minitok")
    assert own.source_code_url == "https://github.com/example/minitok"
    assert Settings(source_github_repository="").source_code_url is None
    assert Settings(source_github_repository=None).source_repository is None
    monkeypatch.setenv("NIGHTBENCH_SOURCE_REPO_PATH", str(tmp_path))
    monkeypatch.setenv("NIGHTBENCH_SOURCE_GITHUB_REPOSITORY", "pytorch/pytorch")
    assert get_settings().source_repository == "pytorch/pytorch"


@pytest.mark.parametrize(
    ("origin", "repository"),
    [
        ("https://github.com/pytorch/pytorch.git", "pytorch/pytorch"),
        ("https://github.com/pytorch/pytorch", "pytorch/pytorch"),
        ("git@github.com:pytorch/pytorch.git", "pytorch/pytorch"),
        ("ssh://git@github.com/example/mini.tok.git", "example/mini.tok"),
        ("https://gitlab.com/pytorch/pytorch.git", None),
        ("/srv/mirrors/pytorch", None),
        (None, None),
    ],
)
def test_a_local_clone_links_to_the_github_repository_of_its_origin(
    tmp_path: Path, origin: str | None, repository: str | None
) -> None:
    """A pytorch clone configured as the source (its origin on GitHub) keeps its links; a clone
    whose origin is elsewhere, or that has none, gets bare shas."""
    import git

    from service.config import github_repository_of

    clone = tmp_path / "clone"
    with git.Repo.init(clone) as repo:
        if origin is not None:
            repo.create_remote("origin", origin)
    github_repository_of.cache_clear()
    settings = Settings(source_repo_path=clone)
    assert settings.source_repository == repository
    assert settings.source_code_url == (f"https://github.com/{repository}" if repository else None)
    # An explicit setting wins over the clone's origin.
    assert Settings(source_repo_path=clone, source_github_repository="").source_repository is None


def test_settings_in_use_stand_over_the_environment_until_their_block_ends(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("NIGHTBENCH_THRESHOLD", "0.1")
    outer = get_settings()
    changed = settings_with(data_dir=tmp_path, count_instructions=False)
    # What the environment set stays set; the changes are validated as the variables are.
    assert (changed.threshold, changed.data_dir, changed.count_instructions) == (
        0.1,
        tmp_path,
        False,
    )
    with pytest.raises(ValidationError):
        settings_with(threshold=-1)
    with use_settings(changed):
        get_settings.cache_clear()  # as tests and the demo do: the block's settings still stand
        assert get_settings() is changed
        with use_settings(settings_with(count_instructions=True)) as inner:
            assert get_settings() is inner and inner.data_dir == tmp_path
        assert get_settings() is changed
    assert get_settings() == outer
