"""A night's plan from the suite's listing: names and patterns, the own suite by default,
TorchBench's models when named, unavailable models skipped; and a TorchBench night end to end."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from service.config import get_settings
from service.db import session_scope
from service.errors import InvalidInput
from service.models import Result, Run
from service.runs.report import run_report
from tests.suite.helpers import FIXTURES
from workers.cli import app
from workers.night.plan import plan, plan_night

CATALOG = [
    {"name": "resnet18", "suite": "nightbench", "modes": ["train", "eval"], "devices": ["cpu"]},
    {"name": "dcgan", "suite": "nightbench", "modes": ["train", "eval"], "devices": ["cpu"]},
    {
        "name": "torchbench.hf_Bert",
        "suite": "torchbench",
        "modes": ["train", "eval"],
        "devices": ["cpu", "cuda"],
    },
    {"name": "torchbench.hf_T5", "suite": "torchbench", "modes": ["eval"], "devices": ["cpu"]},
    {
        "name": "torchbench.Background_Matting",
        "suite": "torchbench",
        "modes": ["train", "eval"],
        "devices": ["cpu"],
        "available": False,
        "reason": "missing requirement(s): tensorboardX",
    },
]
CHECKOUT = FIXTURES / "torchbench"


def _names(specs: list) -> list[str]:
    return sorted({s.model for s in specs})


def test_without_models_the_night_is_the_own_suite() -> None:
    assert _names(plan(CATALOG)) == ["dcgan", "resnet18"]


def test_a_test_offered_on_another_device_only_is_not_planned_here() -> None:
    catalog = [
        {
            "name": "torchbench.llama",
            "suite": "torchbench",
            "modes": ["train", "eval"],
            "devices": ["cpu", "cuda"],
            "not_implemented": ["train:cpu"],
        }
    ]
    cpu = plan(catalog, models=["torchbench.llama"])
    assert [(s.mode, s.device) for s in cpu] == [("eval", "cpu")]
    both = plan(catalog, models=["torchbench.llama"], devices=["cpu", "cuda"])
    assert {(s.mode, s.device) for s in both} == {
        ("eval", "cpu"),
        ("train", "cuda"),
        ("eval", "cuda"),
    }


def test_an_inductor_night_leaves_out_models_that_are_eager_only() -> None:
    catalog = [
        *CATALOG[:2],
        {
            "name": "quantized_lstm",
            "suite": "nightbench",
            "modes": ["eval"],
            "devices": ["cpu"],
            "compilers": ["eager"],
        },
    ]
    both = plan(catalog, compilers=["eager", "inductor"])
    assert {(s.model, s.compiler) for s in both if s.model == "quantized_lstm"} == {
        ("quantized_lstm", "eager")
    }
    assert {s.compiler for s in both if s.model == "dcgan"} == {"eager", "inductor"}
    with pytest.raises(InvalidInput, match="compilers"):
        plan(catalog, models=["quantized_lstm"], compilers=["inductor"])


def test_torchbench_models_by_name_and_pattern(caplog: pytest.LogCaptureFixture) -> None:
    specs = plan(CATALOG, models=["torchbench.hf_*", "dcgan"], modes=["eval"])
    assert [(s.model, s.mode) for s in specs] == [
        ("torchbench.hf_Bert", "eval"),
        ("torchbench.hf_T5", "eval"),
        ("dcgan", "eval"),
    ]
    specs = plan(CATALOG, models=["torchbench.*"])  # the unavailable one is skipped, told why
    assert "torchbench.Background_Matting" not in _names(specs)
    assert (
        "torchbench.Background_Matting skipped: missing requirement(s): tensorboardX" in caplog.text
    )


def test_a_name_or_pattern_matching_nothing_is_named() -> None:
    with pytest.raises(InvalidInput, match=r"unknown model\(s\): torchbench.nope, hf_\*"):
        plan(CATALOG, models=["dcgan", "torchbench.nope", "hf_*"])


def test_a_bare_torchbench_name_is_pointed_to_its_prefixed_name() -> None:
    with pytest.raises(
        InvalidInput,
        match=r"unknown model\(s\): hf_Bert, nope; .*"
        r"\(TorchBench's are named torchbench.hf_Bert\)",
    ):
        plan(CATALOG, models=["hf_Bert", "nope"])


def test_a_torchbench_night_twice_compares_with_the_first(configure: Callable[..., None]) -> None:
    configure(torchbench_path=CHECKOUT)
    runner = CliRunner()
    for night in ("2026-11-01", "2026-11-02"):
        out = runner.invoke(
            app, ["nightly", "--models", "torchbench.tiny_mlp", "--modes", "eval", "--date", night]
        )
        assert out.exit_code == 0, out.output
    with session_scope() as session:
        runs = list(session.scalars(select(Run).where(Run.kind == "nightly").order_by(Run.id)))
        assert [r.status for r in runs] == ["complete", "complete"]
        stored = session.scalars(select(Result).where(Result.metric == "latency")).all()
        assert {(r.model, r.error) for r in stored} == {("torchbench.tiny_mlp", None)}
        report = run_report(session, run_id=runs[1].id, settings=get_settings())
        latency = next(r for r in report["results"] if r["metric"] == "latency")
        assert latency["baseline"] is not None  # the second night is compared with the first


def test_a_model_skipped_at_planning_is_in_the_nights_report_with_its_reason(
    configure: Callable[..., None],
) -> None:
    configure(torchbench_path=CHECKOUT)
    out = CliRunner().invoke(
        app,
        [
            "nightly",
            "--models",
            "torchbench.tiny_mlp,torchbench.needs_tensorboardx",
            "--modes",
            "eval",
            "--date",
            "2026-11-03",
        ],
    )
    assert out.exit_code == 0, out.output
    assert "skipped torchbench.needs_tensorboardx:eval:cpu: " in " ".join(out.output.split())
    with session_scope() as session:
        run = session.scalars(select(Run).where(Run.kind == "nightly")).one()
        assert run.status == "complete"  # a skip is not missing data
        report = run_report(session, run_id=run.id, settings=get_settings())
    assert report["run"]["jobs"]["skipped"] == 1 and report["run"]["jobs"]["done"] == 1
    [skip] = report["skipped"]
    assert skip["benchmark"] == "torchbench.needs_tensorboardx:eval:cpu"
    assert "missing requirement(s): nightbench-fixture-tensorboardx-not-installed" in skip["reason"]


def test_the_plan_keeps_each_skipped_benchmark_with_the_listings_reason() -> None:
    planned = plan_night(CATALOG, models=["torchbench.*"], modes=["eval"])
    assert "torchbench.Background_Matting" not in _names(planned.benchmarks)
    assert [(s.name, reason) for s, reason in planned.skipped] == [
        (
            "torchbench.Background_Matting:eval:cpu",
            "missing requirement(s): tensorboardX",
        )
    ]
    with pytest.raises(InvalidInput, match="no benchmark matches"):
        plan_night(CATALOG, models=["torchbench.Background_Matting"])


def test_status_command_exits_1_and_names_an_overdue_run(database_url: str) -> None:
    from datetime import date, timedelta

    from service.models.base import utcnow
    from service.runs.service import BenchmarkSpec
    from workers.night.plan import create_night

    runner = CliRunner()
    quiet = runner.invoke(app, ["status"])
    assert quiet.exit_code == 0 and "no problems" in quiet.output
    run_id = create_night(
        night=date(2026, 11, 20), benchmarks=[BenchmarkSpec(model="dcgan", mode="eval")]
    )
    with session_scope() as session:
        session.get(Run, run_id).deadline_at = utcnow() - timedelta(hours=3)
    loud = runner.invoke(app, ["status", "--json"])
    assert loud.exit_code == 1
    import json

    problems = json.loads(loud.output)["problems"]
    assert problems == [
        f"run {run_id} (nightly, night 2026-11-20) is past its deadline by "
        f"3.0 h with 1 job(s) not reported"
    ]


def test_status_command_lists_a_failing_filing_and_exits_1(database_url: str) -> None:
    import json
    from datetime import date, timedelta

    from service.models import Alert, FilingState
    from service.models.base import utcnow
    from service.runs.service import BenchmarkSpec
    from workers.night.plan import create_night

    run_id = create_night(
        night=date(2026, 11, 21), benchmarks=[BenchmarkSpec(model="dcgan", mode="eval")]
    )
    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None
        run.status, run.deadline_at = "complete", None
        alert = Alert(
            run_id=run_id,
            kind="regression",
            status="open",
            summary="dcgan eval +12%",
            filing_state=FilingState.FAILED_RETRYING,
            filing_attempts=2,
            filing_error="GitHub refused the token (401): set NIGHTBENCH_GITHUB_TOKEN",
            filing_pending_since=utcnow() - timedelta(hours=5),
            filing_next_at=utcnow() + timedelta(minutes=10),
        )
        session.add(alert)
        session.flush()
        alert_id = alert.id
    result = CliRunner().invoke(app, ["status", "--json"])
    assert result.exit_code == 1, result.output
    state = json.loads(result.output)
    [pending] = state["pending_filings"]
    assert (pending["alert_id"], pending["state"], pending["attempts"]) == (
        alert_id,
        "failed_retrying",
        2,
    )
    assert "401" in pending["last_error"] and pending["age_s"] >= 5 * 3600 - 60
    assert any(p.startswith(f"alert {alert_id} ") for p in state["problems"])
    table = CliRunner().invoke(app, ["status"])
    assert table.exit_code == 1 and "filings pending" in table.output


def test_nightly_suite_torchbench_from_a_checkout_flag(configure: Callable[..., None]) -> None:
    import os

    out = CliRunner().invoke(
        app,
        [
            "nightly",
            "--suite",
            "torchbench",
            "--torchbench",
            str(CHECKOUT),
            "--modes",
            "eval",
            "--date",
            "2026-11-03",
        ],
    )
    assert out.exit_code == 0, out.output
    # The flag is a setting of that command alone: the environment is not written, and the
    # settings after it are the environment's again.
    assert "NIGHTBENCH_TORCHBENCH_PATH" not in os.environ
    assert get_settings().torchbench_path is None
    with session_scope() as session:
        measured = {r.model for r in session.scalars(select(Result))}
    # Unavailable (a missing requirement) and CPU-not-implemented models are left out.
    assert measured == {"torchbench.staged_mlp", "torchbench.tiny_mlp"}


def test_with_suite_torchbench_bare_model_names_are_torchbench_s(
    configure: Callable[..., None],
) -> None:
    out = CliRunner().invoke(
        app,
        [
            "nightly",
            "--suite",
            "torchbench",
            "--torchbench",
            str(CHECKOUT),
            "--models",
            "tiny_mlp",
            "--modes",
            "eval",
            "--date",
            "2026-11-03",
        ],
    )
    assert out.exit_code == 0, out.output
    with session_scope() as session:
        assert {r.model for r in session.scalars(select(Result))} == {"torchbench.tiny_mlp"}


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--suite", "bogus"], "--suite must be one of own, torchbench, all, got 'bogus'"),
        (["--suite", "torchbench"], "--suite torchbench needs a TorchBench checkout"),
        (["--torchbench", "/tmp"], "--torchbench /tmp is not a pytorch/benchmark checkout"),
    ],
)
def test_bad_suite_arguments_are_named_and_store_nothing(
    database_url: str, args: list[str], says: str
) -> None:
    out = CliRunner().invoke(app, ["nightly", *args, "--date", "2026-11-04"])
    assert out.exit_code == 2 and says in " ".join(out.output.split()), out.output
    with session_scope() as session:
        assert session.scalars(select(Run)).first() is None
