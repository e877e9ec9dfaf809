"""runs.finish_owed_since: a run whose night.finish may have been lost

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-29 06:10:00.000000+00:00

A run goes ``detecting`` when its last job ends and the worker then sends ``night.finish``; a
broker down at that moment lost the message and the night was never judged. The column is set
with the move to ``detecting`` and cleared once ``night.finish`` has sent its next steps; the
deadline sweep re-sends it for a run on which it stays set. Rows stored before keep NULL.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0008'
down_revision: str | None = '0007'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.add_column(sa.Column('finish_owed_since', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.drop_column('finish_owed_since')
