"""bisection_profiles: what changed between the builds either side of a culprit

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-29 09:40:00.000000+00:00

One row per benchmark a finished bisection profiled (the profile probe, docs/profile.md): the
two shas, the diff of their profiles as JSON, or the reason the probe failed, and each build's
Chrome trace (gzip). Bisections stored before have none.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0009'
down_revision: str | None = '0008'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('bisection_profiles',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('bisection_id', sa.Integer(), nullable=False),
    sa.Column('benchmark', sa.String(length=256), nullable=False),
    sa.Column('metric', sa.String(length=64), nullable=False),
    sa.Column('before', sa.String(length=64), nullable=False),
    sa.Column('after', sa.String(length=64), nullable=False),
    sa.Column('culprit', sa.Boolean(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('diff', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('trace_before', sa.LargeBinary(), nullable=True),
    sa.Column('trace_after', sa.LargeBinary(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['bisection_id'], ['bisections.id'], name=op.f('fk_bisection_profiles_bisection_id_bisections'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_bisection_profiles')),
    sa.UniqueConstraint('bisection_id', 'benchmark', name=op.f('uq_bisection_profiles_bisection_id_benchmark'))
    )
    with op.batch_alter_table('bisection_profiles', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_bisection_profiles_bisection_id'), ['bisection_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('bisection_profiles', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_bisection_profiles_bisection_id'))
    op.drop_table('bisection_profiles')
