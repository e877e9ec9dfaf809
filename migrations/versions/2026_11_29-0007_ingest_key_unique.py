"""runs.ingest_key: an ingest run's idempotency key, unique

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-29 06:00:00.000000+00:00

The key lived in ``runs.options`` with no index, so two requests racing with one key could
both miss it and make two runs (4 of 5 races did). A unique column makes the second request
wait for the first and then find its run. Runs made before keep their key in ``options``; the
oldest run of each key takes it into the column (a later duplicate keeps none).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0007'
down_revision: str | None = '0006'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.add_column(sa.Column('ingest_key', sa.String(length=128), nullable=True))
    key = (
        "runs.options ->> 'ingest_key'"
        if op.get_bind().dialect.name == 'postgresql'
        else "json_extract(runs.options, '$.ingest_key')"
    )
    first = key.replace('runs.', 'first.')
    op.execute(
        f"UPDATE runs SET ingest_key = {key} WHERE kind = 'ingest' AND {key} IS NOT NULL "
        f"AND id = (SELECT min(first.id) FROM runs AS first WHERE first.kind = 'ingest' "
        f"AND {first} = {key})"
    )
    with op.batch_alter_table('runs') as batch:
        batch.create_unique_constraint('uq_runs_ingest_key', ['ingest_key'])


def downgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.drop_constraint('uq_runs_ingest_key', type_='unique')
        batch.drop_column('ingest_key')
