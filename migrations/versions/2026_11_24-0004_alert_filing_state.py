"""alerts.filing_*: filing an alert's issue as a durable state of its own

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24 09:00:00.000000+00:00

A filing that fails (GitHub rejecting the token, an outage) stays ``failed_retrying`` with its
last error and attempts, and is retried until ``filed``. Alerts already filed
(``status = 'filed'``) become ``filed``; open regression alerts whose run finished with
reproduced regressions were lost by the old path and become ``pending``, so the retry files
them.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('alerts') as batch:
        batch.add_column(sa.Column('filing_state', sa.String(length=16), nullable=True))
        batch.add_column(sa.Column('filing_attempts', sa.Integer(), nullable=False,
                                   server_default='0'))
        batch.add_column(sa.Column('filing_error', sa.Text(), nullable=True))
        batch.add_column(sa.Column('filing_pending_since', sa.DateTime(timezone=True),
                                   nullable=True))
        batch.add_column(sa.Column('filing_next_at', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('filed_at', sa.DateTime(timezone=True), nullable=True))
        batch.create_index(op.f('ix_alerts_filing_state'), ['filing_state'], unique=False)
    with op.batch_alter_table('alerts') as batch:
        batch.alter_column('filing_attempts', server_default=None)
    op.execute("UPDATE alerts SET filing_state = 'filed', filed_at = created_at "
               "WHERE status = 'filed'")
    op.execute(
        "UPDATE alerts SET filing_state = 'pending', filing_pending_since = created_at "
        "WHERE status = 'open' AND kind = 'regression' "
        "AND run_id IN (SELECT id FROM runs WHERE status IN ('complete', 'incomplete')) "
        "AND id IN (SELECT alert_id FROM regressions WHERE confirmation = 'reproduced' "
        "AND direction = 'regression' AND alert_id IS NOT NULL)")


def downgrade() -> None:
    with op.batch_alter_table('alerts') as batch:
        batch.drop_index(op.f('ix_alerts_filing_state'))
        batch.drop_column('filed_at')
        batch.drop_column('filing_next_at')
        batch.drop_column('filing_pending_since')
        batch.drop_column('filing_error')
        batch.drop_column('filing_attempts')
        batch.drop_column('filing_state')
