"""regressions.first_result_id, first_night: where a step raised on a later night began

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 19:00:00.000000+00:00

A step the detector raises after it persisted over several nights began on its first night
at the new level, not on the night it was raised: the commit range to bisect ends at that
night's build. Rows stored before this revision keep NULL (their own night).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0003'
down_revision: str | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Batch mode: SQLite (the embedded default) cannot ALTER constraints; Postgres alters in
    # place.
    with op.batch_alter_table('regressions') as batch:
        batch.add_column(sa.Column('first_result_id', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('first_night', sa.Date(), nullable=True))
        batch.create_foreign_key(op.f('fk_regressions_first_result_id_results'), 'results',
                                 ['first_result_id'], ['id'], ondelete='SET NULL')


def downgrade() -> None:
    with op.batch_alter_table('regressions') as batch:
        batch.drop_constraint(op.f('fk_regressions_first_result_id_results'), type_='foreignkey')
        batch.drop_column('first_night')
        batch.drop_column('first_result_id')
