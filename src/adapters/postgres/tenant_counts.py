"""What each tenant holds, for its limits: its streams (migration 0505, counted by triggers) and
its bytes (migration 0509: what its records count and its open object intents pledge, counted by
the statements that write and delete records and that open and end intents; migration 0510: its
append receipts, counted by the statements that write and forget them; migration 0511: the
default wait service's copies of its input records, counted by triggers) and its tokens
(migration 0512, counted by triggers). A TRUNCATE of a counted table empties its count or has
the bytes counted again (migration 0513).

Every statement that inserts or deletes streams or records adds its change to the row of its own
backend (`pg_backend_pid()`) in `tenant_stream_counts` or `tenant_byte_counts`, in its own
transaction: so a count is exact once committed, and no two transactions wait for each other on
it. A tenant's count is the sum of its rows: one per backend that changed it since the last
fold, and backend 0's. The fold moves the rows of backends that have ended into backend 0's; a
backend still running keeps its row (its transaction may hold it)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg

from domain.records import RECEIPT_BYTES, ROW_BYTES, RecordKind

log = logging.getLogger("ductor_streams.cleanup")

_COUNT = """
SELECT coalesce(sum({column}), 0)::bigint FROM {table} WHERE tenant = $1
"""
_STREAMS = ("tenant_stream_counts", "streams")
_BYTES = ("tenant_byte_counts", "bytes")
_TOKENS = ("tenant_token_counts", "tokens")

# What a row of `stream_records` counts in its tenant's bytes, as `domain.records.held_bytes`
# counts the record: its size, its row, and an object's reference.
RECORD_BYTES = (
    f"size + CASE WHEN kind = {int(RecordKind.OBJECT)} THEN octet_length(payload) ELSE 0 END"
    f" + {ROW_BYTES}"
)

# What a row of `append_receipts` counts, as `domain.records.receipt_bytes` counts the receipt.
RECEIPT_COUNT = f"octet_length(idempotency_key) + {RECEIPT_BYTES}"

# What a row of `workflow_wait_events` counts (the default wait service's copy of an input
# stream's record, kept until it is deleted), as migration 0511's triggers count it: its size
# (its payload as given, or as stored for an event of an earlier version) and its row.
WAIT_EVENT_COUNT = f"coalesce(size, octet_length(payload::text)) + {ROW_BYTES}"

# What a row of `streams` counts, as `domain.stream.definition_bytes` counts the stream: its
# definition and its row (added and taken away by migration 0509's triggers on `streams`).
DEFINITION_BYTES = f"octet_length(definition) + {ROW_BYTES}"

# The pledge of an intent opened by a process of an earlier version (its reference not known
# here): its size and a row, as migration 0509 set it for the intents it found.
RECORD_PLEDGE = f"size + {ROW_BYTES}"

# The bytes of the records in the row set `{records}` (tenant, size), added (`sign` '') or taken
# away ('-') from their tenants' counts, as part of the statement that inserts or deletes them:
# a CTE of its own (`WITH ... counted AS (COUNT_BYTES)`). Each tenant's row of this backend, in
# the key's order.
COUNT_BYTES = """
    INSERT INTO tenant_byte_counts AS c (tenant, backend, bytes)
    SELECT b.tenant, pg_backend_pid(), {sign}sum(b.size) FROM ({records}) AS b
    GROUP BY b.tenant ORDER BY b.tenant
    ON CONFLICT (tenant, backend) DO UPDATE SET bytes = c.bytes + excluded.bytes"""

# The rows of backends no longer running, summed into backend 0's per tenant; then backend 0's
# rows that came to nothing go. A backend that starts meanwhile with the pid of one that ended
# finds its row gone (or takes it over: the sums are what count), never a count lost. A row
# some transaction holds is passed over (SKIP LOCKED), not waited for: it is a running
# backend's (one that took an ended one's pid since the fold looked), and waiting for it while
# it waits for another row the fold holds would be a deadlock.
_FOLD = """
WITH gone AS (
    DELETE FROM {table} c
    WHERE (c.tenant, c.backend) IN (
        SELECT o.tenant, o.backend FROM {table} o
        WHERE o.backend <> 0
          AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = o.backend)
        FOR UPDATE SKIP LOCKED)
    RETURNING tenant, {column}
), folded AS (
    INSERT INTO {table} (tenant, backend, {column})
    SELECT tenant, 0, sum({column}) FROM gone GROUP BY tenant ORDER BY tenant
    ON CONFLICT (tenant, backend)
    DO UPDATE SET {column} = {table}.{column} + excluded.{column}
    RETURNING 1
)
SELECT count(*) FROM gone
"""
# In the key's order, passing over rows others hold: two replicas' sweeps, each emptying and
# folding, would otherwise lock two tenants' rows in opposite orders.
_EMPTY = """
DELETE FROM {table} WHERE (tenant, backend) IN (
    SELECT tenant, backend FROM {table} WHERE backend = 0 AND {column} = 0
    ORDER BY tenant FOR UPDATE SKIP LOCKED)
"""


async def _held(pool: Any, counts: tuple[str, str], tenant: str) -> int:
    """The sum of `tenant`'s rows in the count table `counts` (table, column)."""
    held: int = await pool.fetchval(_COUNT.format(table=counts[0], column=counts[1]), tenant)
    return held


async def tenant_streams(pool: Any, tenant: str) -> int:
    """The streams `tenant` holds (a soft-deleted one too, until it is erased)."""
    return await _held(pool, _STREAMS, tenant)


async def tenant_bytes(pool: Any, tenant: str) -> int:
    """The bytes `tenant` holds: what its streams, records, receipts and wait events count (a
    soft-deleted stream's too, until it is erased) and what its open object intents and
    undelivered input records pledge."""
    return await _held(pool, _BYTES, tenant)


async def tenant_tokens(pool: Any, tenant: str) -> int:
    """The tokens `tenant` holds (revoked and expired ones too, until they are forgotten)."""
    return await _held(pool, _TOKENS, tenant)


# Marked by migration 0513's triggers when one of the bytes' sources was truncated (a TRUNCATE
# fires none of the triggers that count them); the recount clears it.
_RECOUNT_DUE = "SELECT truncated FROM tenant_recounts_due"
FOLD_RECOUNT_ATTEMPTS = 3  # the fold's recount tries a few times, then waits for its next turn


async def fold_tenant_counts(pool: Any) -> int:
    """Fold the rows of ended backends into each tenant's row of backend 0, streams, bytes and
    tokens; answers how many rows it folded. First, if a TRUNCATE of a table the bytes count
    marked their recount as due (migration 0513), it counts every tenant's bytes again; if the
    tables stay too busy to lock, it raises, and the next fold tries again."""
    if (truncated := await pool.fetchval(_RECOUNT_DUE)) is not None:
        log.warning("%s was truncated: counting every tenant's bytes again", truncated)
        await recount_tenant_bytes(pool, FOLD_RECOUNT_ATTEMPTS)
    folded = 0
    for table, column in (_STREAMS, _BYTES, _TOKENS):
        folded += await pool.fetchval(_FOLD.format(table=table, column=column))
        await pool.execute(_EMPTY.format(table=table, column=column))
    return folded


_HELD = """
SELECT tenant, coalesce(s.streams, 0)::bigint AS streams, coalesce(b.bytes, 0)::bigint AS bytes,
       coalesce(k.tokens, 0)::bigint AS tokens
FROM (SELECT tenant, sum(streams) AS streams FROM tenant_stream_counts
      WHERE $1::text IS NULL OR tenant = $1 GROUP BY tenant) s
FULL JOIN (SELECT tenant, sum(bytes) AS bytes FROM tenant_byte_counts
           WHERE $1::text IS NULL OR tenant = $1 GROUP BY tenant) b USING (tenant)
FULL JOIN (SELECT tenant, sum(tokens) AS tokens FROM tenant_token_counts
           WHERE $1::text IS NULL OR tenant = $1 GROUP BY tenant) k USING (tenant)
WHERE coalesce(s.streams, 0) <> 0 OR coalesce(b.bytes, 0) <> 0 OR coalesce(k.tokens, 0) <> 0
ORDER BY 1
"""


async def tenants_held(pool: Any, tenant: str | None = None) -> list[tuple[str, int, int, int]]:
    """(tenant, streams, bytes, tokens) of every tenant that holds any (or of `tenant` alone),
    by tenant: what `ductor-streams tenants` prints."""
    return [(r[0], r[1], r[2], r[3]) for r in await pool.fetch(_HELD, tenant)]


# Every tenant's bytes counted again from the rows, as migrations 0509 to 0511 first counted
# them, while no record, intent, receipt or wait event is written and no sweep folds the counts
# (the locks, until the transaction commits): what a process of an earlier version wrote during
# a rolling upgrade (it counted nothing) is counted then, its open intents given the pledge the
# migration gave those it found; and a TRUNCATE's mark (migration 0513) is cleared with it.
# Writes of every tenant wait for it: a pass over the tables.
_RECOUNT = f"""
LOCK TABLE streams, stream_records, object_intents, append_receipts, workflow_wait_events,
    input_deliveries IN SHARE MODE;
LOCK TABLE tenant_byte_counts IN EXCLUSIVE MODE;
UPDATE object_intents SET pledge = {RECORD_PLEDGE}
WHERE pledge IS NULL AND state IN ('prepared', 'uploaded');
DELETE FROM tenant_byte_counts;
INSERT INTO tenant_byte_counts (tenant, backend, bytes)
SELECT tenant, 0, sum(size) FROM (
    SELECT tenant, {RECORD_BYTES} AS size FROM stream_records
    UNION ALL
    SELECT tenant, pledge AS size FROM object_intents WHERE state IN ('prepared', 'uploaded')
    UNION ALL
    SELECT tenant, {RECEIPT_COUNT} AS size FROM append_receipts
    UNION ALL
    SELECT tenant, {WAIT_EVENT_COUNT} AS size FROM workflow_wait_events
    UNION ALL
    SELECT tenant, pledge AS size FROM input_deliveries
    WHERE pledge IS NOT NULL AND delivered_at IS NULL
    UNION ALL
    SELECT tenant, {DEFINITION_BYTES} AS size FROM streams
) AS held
GROUP BY tenant;
DELETE FROM tenant_recounts_due;
"""


# The recount gives up waiting for its locks before PostgreSQL would look for a deadlock (1 s):
# a large append holds its stream's row, COPYs its records, then writes the row, so a recount
# holding `streams` and waiting for `stream_records` and that append wait for each other. The
# recount is the one to give up (and try again), never the append.
_RECOUNT_LOCK_TIMEOUT = "SET LOCAL lock_timeout = '500ms'"
RECOUNT_ATTEMPTS = 20


async def recount_tenant_bytes(pool: Any, attempts: int = RECOUNT_ATTEMPTS) -> None:
    """Count every tenant's bytes again from its streams, records, receipts, wait events and open
    intents (`tenants --recount`), trying again while the tables are too busy to lock; raises
    `asyncpg.LockNotAvailableError` if they stay so."""
    for attempt in range(attempts):
        try:
            async with pool.acquire() as conn, conn.transaction():
                await conn.execute(_RECOUNT_LOCK_TIMEOUT)
                await conn.execute(_RECOUNT)
            return
        except (asyncpg.LockNotAvailableError, asyncpg.DeadlockDetectedError):
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(0.2 + 0.1 * attempt)
