"""regressions.back_night, back_reason, back_told_at: a series back at its level from before

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-28 14:00:00.000000+00:00

A regression whose series came back to the level it had before the step (the step did not
persist over the nights right after it was raised, or a later improvement undid it) records the
night it was found back and why; its filed issue is told once, in a comment, and
``back_told_at`` records when. Rows stored before this revision keep NULL.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0006'
down_revision: str | None = '0005'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('regressions') as batch:
        batch.add_column(sa.Column('back_night', sa.Date(), nullable=True))
        batch.add_column(sa.Column('back_reason', sa.Text(), nullable=True))
        batch.add_column(sa.Column('back_told_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('regressions') as batch:
        batch.drop_column('back_told_at')
        batch.drop_column('back_reason')
        batch.drop_column('back_night')
