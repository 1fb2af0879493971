"""The object-intent projection and the deletion outbox, written in the stream's transaction."""

from __future__ import annotations

from datetime import datetime

import asyncpg
import msgspec

from adapters.postgres.connections import Connection
from adapters.postgres.tenant_counts import COUNT_BYTES
from application.deletions import UPLOADING
from domain.events import (
    Event,
    ObjectAborted,
    ObjectCommitted,
    ObjectExpired,
    ObjectPrepared,
    ObjectUploaded,
    RecordsPruned,
)
from domain.objects import AuthorizationReceipt, ObjectIntent, pledged_bytes
from domain.stream import StreamKey

_KEY = "tenant = $1 AND run_id = $2 AND stream_id = $3"
OPEN = "('prepared', 'uploaded')"  # the states of an intent whose size is pledged
_encode = msgspec.json.Encoder().encode
_receipt = msgspec.json.Decoder(AuthorizationReceipt)

# An open intent counts in its tenant's bytes (tenant_counts.py) from its prepare until it is
# committed (its record counts the same then), aborted, expired or erased: its `pledge`, what
# its record will count (`domain.objects.pledged_bytes`). One opened by a process of an earlier
# version has none (it counted nothing): it takes nothing away.
_INSERT = f"""
WITH made AS (
    INSERT INTO object_intents
        (tenant, run_id, stream_id, object_id, idempotency_key, state, size, sha256, content_type,
         schema, storage_region, storage_key, receipt, expires_at, created_at, updated_at, pledge)
    VALUES ($1, $2, $3, $4, $5, 'prepared', $6, $7, $8, $9, $10, $11, $12, $13, $14, $14, $15)
    RETURNING tenant, pledge AS size
)
{COUNT_BYTES.format(sign="", records="SELECT tenant, size FROM made")}
"""
_STATE = f"""
UPDATE object_intents SET state = $5, sequence = coalesce($6, sequence), updated_at = $7
WHERE {_KEY} AND object_id = $4
"""
# A state that ends the intent's pledge, taken from its tenant's bytes if it was open.
_ENDED_STATE = f"""
WITH ended AS (
    UPDATE object_intents i
    SET state = $5, sequence = coalesce($6, i.sequence), updated_at = $7
    FROM (SELECT state FROM object_intents WHERE {_KEY} AND object_id = $4) AS before
    WHERE i.tenant = $1 AND i.run_id = $2 AND i.stream_id = $3 AND i.object_id = $4
    RETURNING i.tenant, coalesce(i.pledge, 0) AS size, before.state AS was
)
{COUNT_BYTES.format(sign="-", records=f"SELECT tenant, size FROM ended WHERE was IN {OPEN}")}
"""
# A body is queued once (a unique key). A deletion an upload armed (`UPLOADING`) is taken over
# by the one queued now, done or not: due at once, and, while a put that armed it may still land,
# again at its `upload_until` (the worker deletes twice).
TAKE_OVER = f"""
ON CONFLICT (storage_region, storage_key) DO UPDATE
SET reason = EXCLUDED.reason, done_at = NULL, claimed_by = NULL, lease_until = NULL,
    attempts = 0, next_attempt_at = now(), created_at = now()
WHERE deletion_outbox.reason = '{UPLOADING}'"""
_QUEUE_ONE = f"""
INSERT INTO deletion_outbox (tenant, run_id, stream_id, storage_region, storage_key, reason)
SELECT tenant, run_id, stream_id, storage_region, storage_key, $5 FROM object_intents
WHERE {_KEY} AND object_id = $4
{TAKE_OVER}
"""
# Armed whatever the row holds. An armed row falls due once the last put that armed it can no
# longer land; a deletion already queued (an abort's, perhaps done before this put lands) keeps
# its time and is run again at `upload_until`. A worker's claim of the row is dropped, so its
# `done` (which matches its claim) does not mark the armed deletion done.
_UPLOADING = f"""
INSERT INTO deletion_outbox
    (tenant, run_id, stream_id, storage_region, storage_key, reason, next_attempt_at,
     upload_until, uploads_under_way)
VALUES ($1, $2, $3, $4, $5, '{UPLOADING}', $6, $6, 1)
ON CONFLICT (storage_region, storage_key) DO UPDATE
SET done_at = NULL, claimed_by = NULL, lease_until = NULL, attempts = 0,
    uploads_under_way = deletion_outbox.uploads_under_way + 1,
    upload_until = greatest(deletion_outbox.upload_until, EXCLUDED.upload_until),
    next_attempt_at = CASE WHEN deletion_outbox.reason = '{UPLOADING}'
                           THEN greatest(deletion_outbox.next_attempt_at, EXCLUDED.next_attempt_at)
                           ELSE deletion_outbox.next_attempt_at END
"""
# A put that armed the row has ended (its outcome handled): one fewer under way. The last one
# clears `upload_until` (nothing can land any more) and, for a row still only armed, marks it
# done; a deletion that took the row over runs as queued, once. The row is matched by `$1..$3`
# (and `$4`, `$5`: the body's region and key), or, as `_DISARM`, through the intent it names.
_ENDED = f"""
SET uploads_under_way = greatest(d.uploads_under_way - 1, 0),
    upload_until = CASE WHEN d.uploads_under_way <= 1 THEN NULL ELSE d.upload_until END,
    done_at = CASE WHEN d.uploads_under_way <= 1 AND d.reason = '{UPLOADING}'
                   THEN coalesce(d.done_at, now()) ELSE d.done_at END"""
_PUT_ENDED = f"""
UPDATE deletion_outbox d {_ENDED}
WHERE d.storage_region = $4 AND d.storage_key = $5 AND d.uploads_under_way > 0
  AND (d.tenant, d.run_id, d.stream_id) = ($1, $2, $3)
"""
# In the transaction that marks the intent uploaded: its put has ended.
_DISARM = f"""
UPDATE deletion_outbox d {_ENDED}
FROM object_intents i
WHERE i.tenant = $1 AND i.run_id = $2 AND i.stream_id = $3 AND i.object_id = $4
  AND d.storage_region = i.storage_region AND d.storage_key = i.storage_key
  AND d.uploads_under_way > 0
"""
# A pruned record's object goes with it: its intent is removed as its body is queued for
# deletion. (Kept, every prune of the stream read all its committed intents again, and once a
# done deletion was forgotten queued its body again: rows and deletions without bound.)
_QUEUE_PRUNED = f"""
WITH pruned AS (
    DELETE FROM object_intents
    WHERE {_KEY} AND state = 'committed' AND sequence <= $4
    RETURNING tenant, run_id, stream_id, storage_region, storage_key
)
INSERT INTO deletion_outbox (tenant, run_id, stream_id, storage_region, storage_key, reason)
SELECT tenant, run_id, stream_id, storage_region, storage_key, 'pruned' FROM pruned
{TAKE_OVER}
"""
_SELECT = f"""
SELECT object_id, idempotency_key, state, size, sha256, content_type, schema, storage_region,
       storage_key, receipt, expires_at, created_at, sequence
FROM object_intents WHERE {_KEY} AND object_id = $4
"""
_EXPIRED = """
SELECT tenant, run_id, stream_id, object_id FROM object_intents
WHERE state IN ('prepared', 'uploaded') AND expires_at <= $1
ORDER BY expires_at LIMIT $2
"""


# The events `project_objects` writes rows for (every other event leaves the intents as they are).
PROJECTED = (
    ObjectPrepared,
    ObjectUploaded,
    ObjectCommitted,
    ObjectAborted,
    ObjectExpired,
    RecordsPruned,
)


async def project_objects(conn: Connection, key: StreamKey, events: list[Event]) -> None:
    for event in events:
        match event:
            case ObjectPrepared(intent=i):
                await conn.execute(
                    _INSERT,
                    *key,
                    i.object_id,
                    i.idempotency_key,
                    i.size,
                    bytes.fromhex(i.sha256),
                    i.content_type,
                    _encode(i.schema),
                    i.storage_region,
                    i.storage_key,
                    _encode(i.receipt),
                    i.expires_at,
                    i.created_at,
                    pledged_bytes(i),
                )
            case ObjectUploaded(object_id=oid):
                await conn.execute(_STATE, *key, oid, "uploaded", None, event.at)
                await conn.execute(_DISARM, *key, oid)
            case ObjectCommitted(object_id=oid, sequence=sequence):
                await conn.execute(_ENDED_STATE, *key, oid, "committed", sequence, event.at)
            case ObjectAborted(object_id=oid) | ObjectExpired(object_id=oid):
                state = "aborted" if isinstance(event, ObjectAborted) else "expired"
                await conn.execute(_ENDED_STATE, *key, oid, state, None, event.at)
                await conn.execute(_QUEUE_ONE, *key, oid, state)
            case RecordsPruned(through_sequence=through):
                await conn.execute(_QUEUE_PRUNED, *key, through)


async def read_intent(pool: asyncpg.Pool, key: StreamKey, object_id: str) -> ObjectIntent | None:
    row = await pool.fetchrow(_SELECT, *key, object_id)
    if row is None:
        return None
    return ObjectIntent(
        object_id=row[0],
        idempotency_key=row[1],
        state=row[2],
        size=row[3],
        sha256=row[4].hex(),
        content_type=row[5],
        schema=msgspec.json.decode(row[6]) if row[6] is not None else None,
        storage_region=row[7],
        storage_key=row[8],
        receipt=_receipt.decode(row[9]),
        expires_at=row[10],
        created_at=row[11],
        sequence=row[12],
    )


async def arm_upload(
    pool: asyncpg.Pool, key: StreamKey, storage_region: str, storage_key: str, due: datetime
) -> None:
    await pool.execute(_UPLOADING, *key, storage_region, storage_key, due)


async def upload_ended(
    pool: asyncpg.Pool, key: StreamKey, storage_region: str, storage_key: str
) -> None:
    await pool.execute(_PUT_ENDED, *key, storage_region, storage_key)


async def read_expired_intents(
    pool: asyncpg.Pool, now: datetime, limit: int
) -> list[tuple[StreamKey, str]]:
    rows = await pool.fetch(_EXPIRED, now, limit)
    return [(StreamKey(r[0], r[1], r[2]), r[3]) for r in rows]
