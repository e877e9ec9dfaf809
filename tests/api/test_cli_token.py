"""``nightbench token create`` prints a token once and stores only its hash."""

from __future__ import annotations

from sqlalchemy import select
from typer.testing import CliRunner

from service.auth import hash_token, verify_token
from service.db import session_scope
from service.models import ApiToken
from workers.cli import app


def test_token_create_prints_once_and_stores_the_hash(database_url: str) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["token", "create", "--name", "ci-runner-a100"])
    assert result.exit_code == 0, result.output
    plain = result.stdout.strip().splitlines()[-1]
    assert plain.startswith("nb_") and len(plain) > 40
    with session_scope() as session:
        row = session.scalar(select(ApiToken).where(ApiToken.name == "ci-runner-a100"))
        assert row is not None and row.token_hash == hash_token(plain)
        assert plain not in {row.token_hash, row.name}
        assert verify_token(session, token=plain).id == row.id

    again = runner.invoke(app, ["token", "create", "--name", "ci-runner-a100"])
    assert again.exit_code == 2 and "a token named 'ci-runner-a100' exists" in again.output

    assert runner.invoke(app, ["token", "revoke", "--name", "ci-runner-a100"]).exit_code == 0
    with session_scope() as session:
        assert session.scalar(select(ApiToken)) is None
    gone = runner.invoke(app, ["token", "revoke", "--name", "ci-runner-a100"])
    assert gone.exit_code == 2 and "no token named 'ci-runner-a100'" in gone.output
