"""series_months: each series' points by month, kept by triggers on results

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 18:30:00.000000+00:00

A model's full history (12 series x 1,096 nights) read row by row costs more in decoding
13,152 rows than in the database; packed by month it is a few hundred rows of bytes. On
Postgres the table is filled from the stored results here and kept by triggers: every insert,
update or delete of results (ORM inserts, ``COPY``, cascades) rebuilds the months it touches
from the results themselves, so it always equals what ``ix_results_history`` returns. Other
databases (SQLite) get the empty table only; the service reads their history row by row.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# One point: result id, run id, night (days since 2000-01-01), median and IQR (NaN for none),
# sample count (0 for none); 40 bytes, big-endian (service.models.result.POINT_FIELDS).
_POINT = ("int8send(r.id::int8) || int8send(r.run_id::int8) || int4send(r.night - DATE '2000-01-01')"
          " || float8send(coalesce(r.median, 'NaN')) || float8send(coalesce(r.iqr, 'NaN'))"
          " || int4send(coalesce(r.sample_count, 0))")
_HISTORY_RUNS = "r.run_id NOT IN (SELECT id FROM runs WHERE kind NOT IN ('nightly', 'ingest'))"

_STATEMENTS = (f"""
CREATE FUNCTION series_months_refresh(models varchar[], keys varchar[], months date[])
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    -- Lock the months to rebuild (a placeholder where none is stored yet), in key order: a
    -- concurrent writer of the same month waits here until this transaction ends, and the
    -- rebuild below, a statement of its own, then sees the rows it committed.
    INSERT INTO series_months (model, series_key, month, mode, device, compiler, metric,
                               nights, points)
    SELECT t.model, t.k, t.m, '', '', '', '', 0, ''::bytea
    FROM unnest(models, keys, months) AS t(model, k, m)
    ORDER BY t.model, t.k, t.m
    ON CONFLICT DO NOTHING;
    PERFORM 1 FROM series_months s
    JOIN unnest(models, keys, months) AS t(model, k, m)
      ON s.model = t.model AND s.series_key = t.k AND s.month = t.m
    ORDER BY s.model, s.series_key, s.month
    FOR UPDATE OF s;
    -- Each month from its results: one index-only scan of ix_results_history per month
    -- (a lateral subquery, so the work grows with the months touched, whatever the plan).
    UPDATE series_months s
    SET mode = coalesce(a.mode, s.mode), device = coalesce(a.device, s.device),
        compiler = coalesce(a.compiler, s.compiler), metric = coalesce(a.metric, s.metric),
        machine_id = a.machine_id, nights = a.nights, points = coalesce(a.points, ''::bytea)
    FROM unnest(models, keys, months) AS t(model, k, m)
    CROSS JOIN LATERAL (
        SELECT min(r.mode) AS mode, min(r.device) AS device, min(r.compiler) AS compiler,
               min(r.metric) AS metric, min(r.machine_id) AS machine_id,
               count(*)::int AS nights,
               string_agg({_POINT}, ''::bytea ORDER BY r.night, r.run_id) AS points
        FROM results r
        WHERE r.model = t.model AND r.series_key = t.k
          AND r.night >= t.m AND r.night < (t.m + interval '1 month')::date
          AND {_HISTORY_RUNS}
    ) a
    WHERE s.model = t.model AND s.series_key = t.k AND s.month = t.m;
    DELETE FROM series_months s
    USING unnest(models, keys, months) AS t(model, k, m)
    WHERE s.model = t.model AND s.series_key = t.k AND s.month = t.m AND s.nights = 0;
END $$
""", """
CREATE FUNCTION series_months_on_results() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    models varchar[];
    keys varchar[];
    months date[];
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        DELETE FROM series_months;
        RETURN NULL;
    ELSIF TG_OP = 'INSERT' THEN
        -- New rows of other run kinds (confirmations, probes) are no history.
        SELECT array_agg(model), array_agg(series_key), array_agg(month)
        INTO models, keys, months
        FROM (SELECT DISTINCT n.model, n.series_key, date_trunc('month', n.night)::date AS month
              FROM new_rows n JOIN runs ON runs.id = n.run_id
              WHERE n.series_key IS NOT NULL AND runs.kind IN ('nightly', 'ingest')) t;
    ELSIF TG_OP = 'UPDATE' THEN
        SELECT array_agg(model), array_agg(series_key), array_agg(month)
        INTO models, keys, months
        FROM (SELECT model, series_key, date_trunc('month', night)::date AS month FROM old_rows
              WHERE series_key IS NOT NULL
              UNION
              SELECT model, series_key, date_trunc('month', night)::date FROM new_rows
              WHERE series_key IS NOT NULL) t;
    ELSE
        -- Deleted rows (a run deleted with its results included: its row is gone already).
        SELECT array_agg(model), array_agg(series_key), array_agg(month)
        INTO models, keys, months
        FROM (SELECT DISTINCT model, series_key, date_trunc('month', night)::date AS month
              FROM old_rows WHERE series_key IS NOT NULL) t;
    END IF;
    IF keys IS NOT NULL THEN
        PERFORM series_months_refresh(models, keys, months);
    END IF;
    RETURN NULL;
END $$
""", """
CREATE FUNCTION series_months_on_run_kind() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    models varchar[];
    keys varchar[];
    months date[];
BEGIN
    SELECT array_agg(model), array_agg(series_key), array_agg(month)
    INTO models, keys, months
    FROM (SELECT DISTINCT model, series_key, date_trunc('month', night)::date AS month
          FROM results WHERE run_id = NEW.id AND series_key IS NOT NULL) t;
    IF keys IS NOT NULL THEN
        PERFORM series_months_refresh(models, keys, months);
    END IF;
    RETURN NULL;
END $$
""", f"""
CREATE FUNCTION series_months_rebuild() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    stored bigint;
BEGIN
    DELETE FROM series_months;
    INSERT INTO series_months (model, series_key, month, mode, device, compiler, metric,
                               machine_id, nights, points)
    SELECT r.model, r.series_key, date_trunc('month', r.night)::date, min(r.mode),
           min(r.device), min(r.compiler), min(r.metric), min(r.machine_id), count(*)::int,
           string_agg({_POINT}, ''::bytea ORDER BY r.night, r.run_id)
    FROM results r
    WHERE r.series_key IS NOT NULL AND {_HISTORY_RUNS}
    GROUP BY r.model, r.series_key, date_trunc('month', r.night)::date;
    GET DIAGNOSTICS stored = ROW_COUNT;
    RETURN stored;
END $$
""", """
CREATE TRIGGER series_months_insert AFTER INSERT ON results
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION series_months_on_results()
""", """
CREATE TRIGGER series_months_update AFTER UPDATE ON results
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION series_months_on_results()
""", """
CREATE TRIGGER series_months_delete AFTER DELETE ON results
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION series_months_on_results()
""", """
CREATE TRIGGER series_months_truncate AFTER TRUNCATE ON results
    FOR EACH STATEMENT EXECUTE FUNCTION series_months_on_results()
""", """
CREATE TRIGGER series_months_run_kind AFTER UPDATE OF kind ON runs
    FOR EACH ROW WHEN (OLD.kind IS DISTINCT FROM NEW.kind)
    EXECUTE FUNCTION series_months_on_run_kind()
""")

_DROP = (
    "DROP TRIGGER IF EXISTS series_months_run_kind ON runs",
    "DROP TRIGGER IF EXISTS series_months_truncate ON results",
    "DROP TRIGGER IF EXISTS series_months_delete ON results",
    "DROP TRIGGER IF EXISTS series_months_update ON results",
    "DROP TRIGGER IF EXISTS series_months_insert ON results",
    "DROP FUNCTION IF EXISTS series_months_rebuild()",
    "DROP FUNCTION IF EXISTS series_months_on_run_kind()",
    "DROP FUNCTION IF EXISTS series_months_on_results()",
    "DROP FUNCTION IF EXISTS series_months_refresh(varchar[], varchar[], date[])",
)


def upgrade() -> None:
    op.create_table('series_months',
    sa.Column('model', sa.String(length=128), nullable=False),
    sa.Column('series_key', sa.String(length=64), nullable=False),
    sa.Column('month', sa.Date(), nullable=False),
    sa.Column('mode', sa.String(length=8), nullable=False),
    sa.Column('device', sa.String(length=8), nullable=False),
    sa.Column('compiler', sa.String(length=16), nullable=False),
    sa.Column('metric', sa.String(length=32), nullable=False),
    sa.Column('machine_id', sa.Integer(), nullable=True),
    sa.Column('nights', sa.Integer(), nullable=False),
    sa.Column('points', sa.LargeBinary(), nullable=False),
    sa.PrimaryKeyConstraint('model', 'series_key', 'month', name=op.f('pk_series_months'))
    )
    if op.get_bind().dialect.name == 'postgresql':
        for statement in _STATEMENTS:
            op.execute(statement)
        # What is stored already (one aggregate over the results; minutes at 10^7 rows).
        op.execute('SELECT series_months_rebuild()')


def downgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        for statement in _DROP:
            op.execute(statement)
    op.drop_table('series_months')
