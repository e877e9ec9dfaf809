"""jobs.heartbeat_at: a running job's last sign of life; alerts.arrived: missing data that came

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25 09:00:00.000000+00:00

A worker host that dies leaves its job ``running`` and its task unacknowledged until the
broker's visibility timeout (hours). The worker measuring a job writes ``heartbeat_at`` every
``job_heartbeat_s``; the deadline sweep requeues a running job silent for ``job_lost_after_s``.
Rows stored before this revision keep NULL (their ``started_at`` stands in).

``models`` is the catalogue of measured models (name, domain), filled from the records' own
``model_domain`` as they are stored: the service no longer reads the suite's files for it.

``alerts.arrived`` lists the benchmarks of a missing-data alert whose data came later (a
re-dispatch of the night, a late post to an ingest run), each told once on its issue.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0005'
down_revision: str | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        'models',
        sa.Column('name', sa.String(length=128), nullable=False),
        sa.Column('domain', sa.String(length=64), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.PrimaryKeyConstraint('name', name=op.f('pk_models')),
    )
    with op.batch_alter_table('alerts') as batch:
        batch.add_column(sa.Column(
            'arrived', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'),
            nullable=True))


def downgrade() -> None:
    op.drop_table('models')
    with op.batch_alter_table('alerts') as batch:
        batch.drop_column('arrived')
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('heartbeat_at')
