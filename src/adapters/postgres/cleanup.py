"""Storage cleanup in PostgreSQL: old bookkeeping rows removed a bounded batch per statement.

Each statement picks at most `batch` rows, oldest first through the index on their age
column, by ctid or id, and deletes exactly those (a row another transaction changed meanwhile
has a new ctid and is left for the next sweep). The next statement starts where the last one's
rows ended ($3), so rows a sweep keeps (a held stream's, each stream's highest delivered one)
are passed over once per sweep, not once per batch. Legal hold is read from `streams` with a
plain SELECT, so a sweep never waits for, or holds, a stream-row lock; a row whose stream is
gone (deleted) belongs to no hold."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg

from adapters.postgres.tenant_counts import fold_tenant_counts


def _not_held(alias: str) -> str:
    return f"""NOT EXISTS (
        SELECT 1 FROM streams s
        WHERE s.tenant = {alias}.tenant AND s.run_id = {alias}.run_id
          AND s.stream_id = {alias}.stream_id AND s.legal_hold)"""


def aged_rows(
    table: str, pick: str, age: str, also: str = "", where: str = "", returning: str = ""
) -> str:
    """The batch statement for `delete_in_batches`: rows of `table` whose `age` column is older
    than $1, not of a held stream (and, with `where`, of which that holds of `t`), oldest
    first, picked by `pick` (ctid or id); each row's `age` returned first (and `returning`'s
    columns after it)."""
    return f"""
DELETE FROM {table} WHERE {pick} = ANY(ARRAY(
    SELECT t.{pick} FROM {table} t
    WHERE t.{age} < now() - $1::interval AND t.{age} >= $3 AND {_not_held("t")}{where}
    ORDER BY t.{age}
    LIMIT $2
)){also}
RETURNING {age}{returning}
"""


# Delivery is in order, so a delivered row with a delivered next row is below the stream's
# highest delivered one, which stays: `delivered_through` is the highest delivered sequence.
_DELIVERED = f"""
DELETE FROM input_deliveries WHERE ctid = ANY(ARRAY(
    SELECT d.ctid FROM input_deliveries d
    WHERE d.delivered_at < now() - $1::interval AND d.delivered_at >= $3
      AND (SELECT n.delivered_at IS NOT NULL FROM input_deliveries n
           WHERE n.tenant = d.tenant AND n.run_id = d.run_id AND n.stream_id = d.stream_id
             AND n.sequence > d.sequence
           ORDER BY n.sequence LIMIT 1)
      AND {_not_held("d")}
    ORDER BY d.delivered_at
    LIMIT $2
))
RETURNING delivered_at
"""

# A done row a put of its body may still land after is kept until then (`upload_until`): the
# deletion that takes it over must still run again at that time.
_DONE_DELETIONS = aged_rows(
    "deletion_outbox",
    "id",
    "done_at",
    " AND done_at IS NOT NULL",
    where=" AND (t.upload_until IS NULL OR t.upload_until < now())",
)
_GAP_EVIDENCE = aged_rows("gap_evidence", "id", "repaired_at")


async def delete_in_batches(
    pool: asyncpg.Pool, statement: str, older_than: timedelta, batch: int
) -> int:
    """Run `statement` ($1 the age, $2 the batch, $3 the oldest age value still to look at;
    it returns the age values it removed) until a batch removes fewer than `batch`."""
    removed = 0
    since = datetime.min.replace(tzinfo=UTC)
    while True:
        rows = await pool.fetch(statement, older_than, batch, since)
        removed += len(rows)
        if len(rows) < batch:
            return removed
        since = max(row[0] for row in rows)


class PostgresCleanup:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def forget_delivered_inputs(self, older_than: timedelta, batch: int = 1000) -> int:
        return await delete_in_batches(self._pool, _DELIVERED, older_than, batch)

    async def forget_done_deletions(self, older_than: timedelta, batch: int = 1000) -> int:
        return await delete_in_batches(self._pool, _DONE_DELETIONS, older_than, batch)

    async def forget_gap_evidence(self, older_than: timedelta, batch: int = 1000) -> int:
        return await delete_in_batches(self._pool, _GAP_EVIDENCE, older_than, batch)

    async def fold_tenant_counts(self) -> int:
        return await fold_tenant_counts(self._pool)
