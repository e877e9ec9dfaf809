"""ab_tests: a pull request's A/B (its merge base against its head) and its report

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-29 12:30:33.620830+00:00

One row per A/B asked for (a PR label or command, ``nightbench ab``): what was asked, the judged
rows as JSON, the two runs of kind ``ab`` holding the processes, and the report's state (the PR
comment edited in place, retried while GitHub refuses it). docs/ab.md.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ab_tests",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("repository", sa.String(length=255), nullable=True),
        sa.Column("pr_number", sa.Integer(), nullable=True),
        sa.Column("requested_by", sa.String(length=255), nullable=True),
        sa.Column("base_sha", sa.String(length=64), nullable=False),
        sa.Column("head_sha", sa.String(length=64), nullable=False),
        sa.Column(
            "options",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "rows",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "profiles",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("base_run_id", sa.Integer(), nullable=True),
        sa.Column("head_run_id", sa.Integer(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("report_state", sa.String(length=24), nullable=False),
        sa.Column("report_attempts", sa.Integer(), nullable=False),
        sa.Column("report_error", sa.Text(), nullable=True),
        sa.Column("next_report_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("comment_id", sa.BigInteger(), nullable=True),
        sa.Column("comment_url", sa.String(length=512), nullable=True),
        sa.Column("reported_head", sa.String(length=64), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["base_run_id"],
            ["runs.id"],
            name=op.f("fk_ab_tests_base_run_id_runs"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["head_run_id"],
            ["runs.id"],
            name=op.f("fk_ab_tests_head_run_id_runs"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ab_tests")),
    )
    with op.batch_alter_table("ab_tests", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_ab_tests_pr_number"), ["pr_number"], unique=False)
        batch_op.create_index(batch_op.f("ix_ab_tests_status"), ["status"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("ab_tests", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ab_tests_status"))
        batch_op.drop_index(batch_op.f("ix_ab_tests_pr_number"))

    op.drop_table("ab_tests")
