"""Erasure: a deleted stream's rows go in the deleting transaction, under its row lock.

One statement removes every row the stream owns and queues every object body it references on
the deletion outbox (the leased deletion workers remove the bodies from their stores: idempotent,
resumable after a crash). The `streams` row goes last; its RETURNING sends the notification that
tells every replica the stream is gone, in the same transaction, so no listener hears it before
the commit.
"""

from __future__ import annotations

from collections.abc import Sequence

from adapters.postgres.connections import Connection
from adapters.postgres.intents import OPEN, TAKE_OVER
from adapters.postgres.tenant_counts import COUNT_BYTES, RECEIPT_COUNT, RECORD_BYTES
from application.deletions import ERASED_STREAM
from domain.stream import StreamKey

WAKE_CHANNEL = "ductor_streams"
DELETED = "deleted"  # the notification's last word for an erased stream, instead of its head

# Every table that holds rows of a stream, keyed (tenant, run_id, stream_id, …). A table that
# keeps a stream's rows must be listed here, or a deleted stream leaves them behind (and a
# stream created again with the same ID would find them).
ERASED_TABLES: tuple[str, ...] = (
    "stream_events",
    "stream_records",
    "append_receipts",
    "stream_consumers",
    "stream_producers",  # idempotent producers (migration 0491; also a cascading foreign key)
    "input_deliveries",
    "object_intents",
    "retention_jobs",
    "gap_evidence",
    "journal_compaction_jobs",
    "stream_access",  # expiry's last accesses (migration 0482; also a cascading foreign key)
    "stream_forks",  # the stream's own link to its source (migration 0487): its reference goes
    # The default wait service's events, which carry the records: a stream created again
    # delivers its own records under the same event ids.
    "workflow_wait_events",
)

_OF_THEM = "tenant = $1 AND run_id = $2 AND stream_id = ANY($3::text[])"
# The tables whose erased rows count in their tenants' bytes: what each returns, and which of
# those count.
_RETURNING = {
    "stream_records": f" RETURNING tenant, {RECORD_BYTES} AS size",
    "object_intents": " RETURNING tenant, coalesce(pledge, 0) AS size, state",
    "append_receipts": f" RETURNING tenant, {RECEIPT_COUNT} AS size",
    "input_deliveries": " RETURNING tenant, coalesce(pledge, 0) AS size, delivered_at",
}
_COUNTED = {
    "stream_records": "",
    "object_intents": f" WHERE state IN {OPEN}",
    "append_receipts": "",
    "input_deliveries": " WHERE size <> 0 AND delivered_at IS NULL",
}
# Streams of any tenants and runs: their keys as three arrays, one element a stream.
_OF_KEYS = (
    "(tenant, run_id, stream_id) IN (SELECT * FROM unnest($1::text[], $2::text[], $3::text[]))"
)


def erase_statement(tables: Sequence[str] = ERASED_TABLES, of_them: str = _OF_THEM) -> str:
    """Data-modifying CTEs all read the statement's snapshot, so the outbox is filled from the
    intents the same statement deletes."""
    deletes = ",\n".join(
        f"erased_{table} AS (DELETE FROM {table} WHERE {of_them}{_RETURNING.get(table, '')})"
        for table in tables
    )
    # The records' and receipts' bytes and the open intents' and undelivered input records'
    # pledges, taken from their tenants' counts (tenant_counts.py) in one part of the
    # statement: two parts that changed the same count row would leave one of the changes.
    # (The streams' and the wait events' own bytes are their triggers', statements of their
    # own once this one is done.)
    counted = [
        f"SELECT tenant, size FROM erased_{table}{_COUNTED[table]}"
        for table in tables
        if table in _COUNTED
    ]
    if counted:
        records = " UNION ALL ".join(counted)
        deletes += f",\nuncounted AS ({COUNT_BYTES.format(sign='-', records=records)})"
    return f"""
WITH bodies AS (
    INSERT INTO deletion_outbox (tenant, run_id, stream_id, storage_region, storage_key, reason)
    SELECT tenant, run_id, stream_id, storage_region, storage_key, $4 FROM object_intents
    WHERE {of_them}
    {TAKE_OVER}
),
{deletes}
DELETE FROM streams WHERE {of_them}
RETURNING pg_notify('{WAKE_CHANNEL}', tenant || '/' || run_id || '/' || stream_id || ' {DELETED}')
"""


_ERASE = erase_statement()
_ERASE_KEYS = erase_statement(of_them=_OF_KEYS)


# In the key's order, as every other statement that holds several streams' rows does.
_LOCK_FOR_ERASURE = f"SELECT 1 FROM streams WHERE {_OF_THEM} ORDER BY stream_id FOR UPDATE"
_LOCK_KEYS_FOR_ERASURE = (
    f"SELECT 1 FROM streams WHERE {_OF_KEYS} ORDER BY tenant, run_id, stream_id FOR UPDATE"
)


async def lock_for_deletion(
    conn: Connection, tenant: str, run_id: str, stream_ids: list[str]
) -> None:
    """FOR UPDATE on these streams' rows, whose caller holds them already (a commit's lock,
    FOR NO KEY UPDATE), in a statement of its own before a deletion (an erasure, a soft delete):
    it waits for what holds a row FOR KEY SHARE (the default wait service's insert of an input
    event), so that the deleting statement, whose snapshot is taken after, sees what that wrote,
    and an insert that comes after sees the deletion."""
    await conn.execute(_LOCK_FOR_ERASURE, tenant, run_id, stream_ids)


async def erase(
    conn: Connection,
    tenant: str,
    run_id: str,
    stream_ids: list[str],
    reason: str,
    *,
    locked_for_update: bool = False,
) -> None:
    """Erase these streams of one run (`reason`: "deleted" or "expired"); the caller holds their
    row locks, and `lock_for_deletion` is taken first (what it waited for is erased too), unless
    the caller took them FOR UPDATE itself in an earlier statement (`locked_for_update`)."""
    if not locked_for_update:
        await lock_for_deletion(conn, tenant, run_id, stream_ids)
    await conn.execute(_ERASE, tenant, run_id, stream_ids, ERASED_STREAM + reason)


async def erase_keys(conn: Connection, keys: Sequence[StreamKey], reason: str) -> None:
    """Erase these streams, of any tenants and runs, as `erase` does one run's: two statements
    however many they are (a batch's deletions). The caller holds their row locks."""
    columns = ([k.tenant for k in keys], [k.run_id for k in keys], [k.stream_id for k in keys])
    await conn.execute(_LOCK_KEYS_FOR_ERASURE, *columns)
    await conn.execute(_ERASE_KEYS, *columns, ERASED_STREAM + reason)
