"""What a group of commands writes to PostgreSQL, for one stream or a batch of streams.

Everything a stream's commands caused (records, journal rows, receipts, consumers, input
deliveries, the new snapshot and its NOTIFY) goes in one statement, `_WRITE`, whose parameters
are `StreamWrite`'s fields by name; a batch of streams (the group commit across streams) writes
all of theirs with `_WRITE_MANY`, the same arrays concatenated with each row's key. Large groups
of records go by COPY first; the rare rest (producers' rows, a soft delete, a prune, objects'
intents, a compaction job) around them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple

import msgspec

from adapters.postgres.connections import Connection
from adapters.postgres.erasure import WAKE_CHANNEL
from adapters.postgres.intents import PROJECTED, project_objects
from adapters.postgres.journal import schedule_compaction
from adapters.postgres.producers import write_producers
from adapters.postgres.traces import TRACES_CHANNEL, trace_announcement
from application import tracing
from application.deciding import Changes
from domain.events import (
    ConsumerAcknowledged,
    ConsumerRemoved,
    RecordsPruned,
    StreamSoftDeleted,
    encode_event,
    event_type,
)
from domain.state import Producer, encode_consumers, encode_state_without_consumers
from domain.stream import Stream, StreamKey

_KEY = "tenant = $1 AND run_id = $2 AND stream_id = $3"


class StreamWrite(NamedTuple):
    """What one stream's group writes: `_WRITE`'s parameters, by name (their numbers follow
    this order), one array per column of each table's rows."""

    tenant: str
    run_id: str
    stream_id: str
    # stream_records (small groups; large ones go by COPY and leave these empty)
    record_sequence: list[int]
    record_appended_at: list[datetime]
    record_kind: list[int]
    record_content_type: list[str]
    record_size: list[int]
    record_end_offset: list[int]
    record_payload: list[bytes]
    # stream_events: the journal
    event_version: list[int]
    event_type: list[str]
    event_payload: list[bytes]
    # append_receipts
    receipt_key: list[str]
    receipt_fingerprint: list[bytes]
    receipt_answer: list[bytes]
    # stream_consumers: each consumer the group changed, as it ends, or gone
    consumer_id: list[str]
    consumer_principal: list[str]
    consumer_acked: list[int]
    consumer_at: list[datetime]
    consumer_holds: list[bool]
    consumer_gone: list[str]
    # input_deliveries: an input stream's records, each with its delivery row
    delivery_sequence: list[int]
    # streams: the row's columns and snapshot
    version: int
    head: int
    earliest: int
    closed: bool
    legal_hold: bool
    state: bytes
    write_consumers: bool
    consumers: bytes | None


_P = {name: f"${n}" for n, name in enumerate(StreamWrite._fields, 1)}
_WRITE_KEY = "tenant = {tenant} AND run_id = {run_id} AND stream_id = {stream_id}"

# One round trip writes everything a group of commands caused (`_WRITE_MANY` below, what a
# batch of streams caused). Data-modifying CTEs always run to completion,
# referenced or not; empty arrays insert nothing.
_WRITE = (
    """
WITH new_records AS (
    INSERT INTO stream_records
        (tenant, run_id, stream_id, sequence, appended_at, kind, content_type, size, end_offset,
         payload)
    SELECT {tenant}, {run_id}, {stream_id}, r.sequence, r.appended_at, r.kind, r.content_type,
           r.size, r.end_offset, r.payload
    FROM unnest({record_sequence}::bigint[], {record_appended_at}::timestamptz[],
                {record_kind}::int2[], {record_content_type}::text[], {record_size}::int4[],
                {record_end_offset}::int8[], {record_payload}::bytea[])
         AS r(sequence, appended_at, kind, content_type, size, end_offset, payload)
), new_events AS (
    INSERT INTO stream_events (tenant, run_id, stream_id, version, type, payload)
    SELECT {tenant}, {run_id}, {stream_id}, e.version, e.type, e.payload
    FROM unnest({event_version}::int8[], {event_type}::text[], {event_payload}::bytea[])
         AS e(version, type, payload)
), new_receipts AS (
    INSERT INTO append_receipts (tenant, run_id, stream_id, idempotency_key, fingerprint, answer)
    SELECT {tenant}, {run_id}, {stream_id}, x.k, x.f, x.a
    FROM unnest({receipt_key}::text[], {receipt_fingerprint}::bytea[],
                {receipt_answer}::bytea[]) AS x(k, f, a)
), acked AS (
    INSERT INTO stream_consumers
        (tenant, run_id, stream_id, consumer_id, principal, acked_sequence, updated_at,
         holds_credit)
    SELECT {tenant}, {run_id}, {stream_id}, c.id, c.principal, c.seq, c.at, c.holds
    FROM unnest({consumer_id}::text[], {consumer_principal}::text[], {consumer_acked}::int8[],
                {consumer_at}::timestamptz[], {consumer_holds}::boolean[])
         AS c(id, principal, seq, at, holds)
    ON CONFLICT (tenant, run_id, stream_id, consumer_id) DO UPDATE
    SET principal = excluded.principal, acked_sequence = excluded.acked_sequence,
        updated_at = excluded.updated_at, holds_credit = excluded.holds_credit
), removed AS (
    DELETE FROM stream_consumers
    WHERE {key} AND consumer_id = ANY({consumer_gone}::text[])
), deliveries AS (
    INSERT INTO input_deliveries (tenant, run_id, stream_id, sequence)
    SELECT {tenant}, {run_id}, {stream_id}, d FROM unnest({delivery_sequence}::bigint[]) AS d
)
UPDATE streams
SET version = {version}::bigint, head = {head}::bigint, earliest = {earliest}::bigint,
    closed = {closed}::boolean, legal_hold = {legal_hold}::boolean, state = {state}::bytea,
    consumers = CASE WHEN {write_consumers}::boolean THEN {consumers}::bytea ELSE consumers END
WHERE {key}
RETURNING pg_notify(
    '{channel}', {tenant} || '/' || {run_id} || '/' || {stream_id} || ' ' || {head}::bigint::text
)
"""
).format(**_P, key=_WRITE_KEY.format(**_P), channel=WAKE_CHANNEL)

# What a batch of streams writes, in one statement: `StreamWrite`'s arrays concatenated over the
# streams (each row with its stream's key: `<table>_tenant`, …) and its one-per-stream columns
# as arrays of their own, for the UPDATE of every stream row from one unnest.
_ROWS = {
    "record": [f for f in StreamWrite._fields if f.startswith("record_")],
    "event": ["event_version", "event_type", "event_payload"],
    "receipt": ["receipt_key", "receipt_fingerprint", "receipt_answer"],
    "consumer": [
        "consumer_id",
        "consumer_principal",
        "consumer_acked",
        "consumer_at",
        "consumer_holds",
    ],
    "gone": ["consumer_gone"],
    "delivery": ["delivery_sequence"],
}
_ONE_EACH = [f for f in StreamWrite._fields if not any(f in fields for fields in _ROWS.values())]
_BATCH_FIELDS = [
    name
    for table, fields in _ROWS.items()
    for name in (f"{table}_tenant", f"{table}_run_id", f"{table}_stream_id", *fields)
] + _ONE_EACH
_B = {name: f"${n}" for n, name in enumerate(_BATCH_FIELDS, 1)}


def _batch_key(table: str) -> str:
    return ", ".join(_B[f"{table}_{c}"] + "::text[]" for c in ("tenant", "run_id", "stream_id"))


_WRITE_MANY = (
    """
WITH new_records AS (
    INSERT INTO stream_records
        (tenant, run_id, stream_id, sequence, appended_at, kind, content_type, size, end_offset,
         payload)
    SELECT * FROM unnest({record_key}, {record_sequence}::bigint[],
                         {record_appended_at}::timestamptz[], {record_kind}::int2[],
                         {record_content_type}::text[], {record_size}::int4[],
                         {record_end_offset}::int8[], {record_payload}::bytea[])
), new_events AS (
    INSERT INTO stream_events (tenant, run_id, stream_id, version, type, payload)
    SELECT * FROM unnest({event_key}, {event_version}::int8[], {event_type}::text[],
                         {event_payload}::bytea[])
), new_receipts AS (
    INSERT INTO append_receipts (tenant, run_id, stream_id, idempotency_key, fingerprint, answer)
    SELECT * FROM unnest({receipt_key_}, {receipt_key}::text[], {receipt_fingerprint}::bytea[],
                         {receipt_answer}::bytea[])
), acked AS (
    INSERT INTO stream_consumers
        (tenant, run_id, stream_id, consumer_id, principal, acked_sequence, updated_at,
         holds_credit)
    SELECT * FROM unnest({consumer_key}, {consumer_id}::text[], {consumer_principal}::text[],
                         {consumer_acked}::int8[], {consumer_at}::timestamptz[],
                         {consumer_holds}::boolean[])
    ON CONFLICT (tenant, run_id, stream_id, consumer_id) DO UPDATE
    SET principal = excluded.principal, acked_sequence = excluded.acked_sequence,
        updated_at = excluded.updated_at, holds_credit = excluded.holds_credit
), removed AS (
    DELETE FROM stream_consumers c
    USING unnest({gone_key}, {consumer_gone}::text[]) AS g(tenant, run_id, stream_id, id)
    WHERE c.tenant = g.tenant AND c.run_id = g.run_id AND c.stream_id = g.stream_id
      AND c.consumer_id = g.id
), deliveries AS (
    INSERT INTO input_deliveries (tenant, run_id, stream_id, sequence)
    SELECT * FROM unnest({delivery_key}, {delivery_sequence}::bigint[])
)
UPDATE streams s
SET version = u.version, head = u.head, earliest = u.earliest, closed = u.closed,
    legal_hold = u.legal_hold, state = u.state,
    consumers = CASE WHEN u.write_consumers THEN u.consumers ELSE s.consumers END
FROM unnest({tenant}::text[], {run_id}::text[], {stream_id}::text[], {version}::bigint[],
            {head}::bigint[], {earliest}::bigint[], {closed}::boolean[],
            {legal_hold}::boolean[], {state}::bytea[], {write_consumers}::boolean[],
            {consumers}::bytea[])
     AS u(tenant, run_id, stream_id, version, head, earliest, closed, legal_hold, state,
          write_consumers, consumers)
WHERE s.tenant = u.tenant AND s.run_id = u.run_id AND s.stream_id = u.stream_id
RETURNING pg_notify(
    '{channel}', u.tenant || '/' || u.run_id || '/' || u.stream_id || ' ' || u.head::text
)
"""
).format(
    **_B,
    **{f"{t}_key": _batch_key(t) for t in _ROWS if t != "receipt"},
    receipt_key_=_batch_key("receipt"),
    channel=WAKE_CHANNEL,
)


def _batch_write(writes: Sequence[StreamWrite]) -> list[list[object]]:
    """`_WRITE_MANY`'s arguments, in `_BATCH_FIELDS`' order, from each stream's write."""
    columns: dict[str, list[object]] = {name: [] for name in _BATCH_FIELDS}
    for w in writes:
        for table, fields in _ROWS.items():
            n = len(getattr(w, fields[0]))
            if not n:
                continue
            columns[f"{table}_tenant"] += [w.tenant] * n
            columns[f"{table}_run_id"] += [w.run_id] * n
            columns[f"{table}_stream_id"] += [w.stream_id] * n
            for name in fields:
                columns[name] += getattr(w, name)
        for name in _ONE_EACH:
            columns[name].append(getattr(w, name))
    return [columns[name] for name in _BATCH_FIELDS]


_DELETE_PRUNED = f"DELETE FROM stream_records WHERE {_KEY} AND sequence <= $4"


SOFT_DELETED = f"""
WITH unswept AS (
    -- nothing is left to expire: only the cascade of its last fork's erasure erases it
    DELETE FROM stream_access WHERE {_KEY}
)
UPDATE streams SET soft_deleted = true WHERE {_KEY}
"""


_RECORD_COLUMNS = (
    "tenant",
    "run_id",
    "stream_id",
    "sequence",
    "appended_at",
    "kind",
    "content_type",
    "size",
    "end_offset",
    "payload",
)
COPY_THRESHOLD = 64

_RecordRow = tuple[str, str, str, int, datetime, int, str, int, int, bytes]


def _record_rows(key: StreamKey, changes: Changes) -> list[_RecordRow]:
    """The rows to write, in one pass (this runs under the row lock, for every record)."""
    tenant, run_id, stream_id = key
    rows: list[_RecordRow] = []
    add = rows.append
    for appended in changes.appended:
        at, sequence, end = appended.at, appended.first_sequence, appended.first_offset
        for r in appended.records:
            end += r.size
            add(
                (
                    tenant,
                    run_id,
                    stream_id,
                    sequence,
                    at,
                    r.kind,
                    r.content_type,
                    r.size,
                    end,
                    r.payload,
                )
            )
            sequence += 1
    return rows


def stream_write(
    stream: Stream, changes: Changes, rows: list[_RecordRow], inline: bool = False
) -> StreamWrite:
    """`inline`: the state was read with its consumers in the snapshot (written before
    migration 0488); they are written to their column now."""
    s = stream.state
    touched = {
        e.consumer_id: None
        for e in changes.events
        if isinstance(e, ConsumerAcknowledged | ConsumerRemoved)
    }
    kept = [(i, s.consumers[i]) for i in touched if i in s.consumers]
    return StreamWrite(
        *stream.key,
        record_sequence=[r[3] for r in rows],
        record_appended_at=[r[4] for r in rows],
        record_kind=[r[5] for r in rows],
        record_content_type=[r[6] for r in rows],
        record_size=[r[7] for r in rows],
        record_end_offset=[r[8] for r in rows],
        record_payload=[r[9] for r in rows],
        event_version=[e.version for e in changes.events],
        event_type=[event_type(e) for e in changes.events],
        event_payload=[encode_event(e) for e in changes.events],
        receipt_key=[r.key for r in changes.receipts],
        receipt_fingerprint=[r.fingerprint for r in changes.receipts],
        receipt_answer=[r.answer_json for r in changes.receipts],
        consumer_id=[i for i, _ in kept],
        consumer_principal=[c.principal for _, c in kept],
        consumer_acked=[c.acked_sequence for _, c in kept],
        consumer_at=[c.updated_at for _, c in kept],
        consumer_holds=[c.holds_credit for _, c in kept],
        consumer_gone=[i for i in touched if i not in s.consumers],
        delivery_sequence=[seq for a in changes.appended for seq in a.sequences]
        if stream.definition.direction == "input"
        else [],
        version=s.version,
        head=s.head,
        earliest=s.earliest,
        closed=s.closed,
        legal_hold=s.legal_hold.enabled,
        # The producers are in rows of their own (adapters/postgres/producers.py), the
        # consumers in their column.
        state=encode_state_without_consumers(
            msgspec.structs.replace(s, producers={}) if s.producers else s
        ),
        write_consumers=bool(touched) or inline,
        consumers=encode_consumers(s.consumers) if touched or inline else None,
    )


async def announce_trace(conn: Connection, key: StreamKey, changes: Changes) -> None:
    """While tracing: tell every process which span appended these sequences (the current one,
    this transaction's, in the trace of the group's first append), before the write statement's
    wake notification, so that another process's live delivery and dispatch can link to it
    (adapters/postgres/wake_bus.py hears it). Sent in the transaction: only if it commits."""
    context = tracing.current()
    if context is None:
        return
    first = changes.appended[0].first_sequence
    last = changes.appended[-1].sequences.stop - 1
    payload = trace_announcement(key, first, last, tracing.traceparent(context))
    await conn.execute("SELECT pg_notify($1, $2)", TRACES_CHANNEL, payload)


async def write(
    conn: Connection,
    key: StreamKey,
    stream: Stream,
    changes: Changes,
    producers: dict[str, Producer] | None = None,
    inline: bool = False,
) -> None:
    """Write what a transaction's commands on one stream caused, its NOTIFY included.
    `producers`: those loaded before the commands were decided."""
    arguments = await before_write(conn, key, stream, changes, producers, inline)
    await execute_write(conn, arguments)
    if has_after_write(changes):
        await after_write(conn, key, changes)


async def execute_write(conn: Connection, arguments: StreamWrite) -> None:
    """`_WRITE`, for one stream."""
    await conn.execute(_WRITE, *arguments)


async def execute_writes(conn: Connection, writes: Sequence[StreamWrite]) -> None:
    """`_WRITE_MANY`: the writes of a batch of streams, in one statement."""
    if writes:
        await conn.execute(_WRITE_MANY, *_batch_write(writes))


# Events after which `after_write` has a statement to run (with a snapshot: the compaction job).
_AFTER = (StreamSoftDeleted, *PROJECTED)


def has_after_write(changes: Changes) -> bool:
    """Whether `after_write` has anything to do: most groups (appends alone) have not, and
    skip the call (a batch of streams makes it once per stream)."""
    return changes.snapshot is not None or any(isinstance(e, _AFTER) for e in changes.events)


async def before_write(
    conn: Connection,
    key: StreamKey,
    stream: Stream,
    changes: Changes,
    producers: dict[str, Producer] | None,
    inline: bool,
) -> StreamWrite:
    """The producers' rows and a large group's records (by COPY), then `_WRITE`'s
    arguments for the rest (the producers first: a snapshot takes them all)."""
    if producers or stream.state.producers or changes.snapshot is not None:
        # (with none loaded and none now, only a snapshot has producers to write: all of them)
        await write_producers(conn, key, producers or {}, stream.state.producers, changes)
    if changes.appended and tracing.on():
        await announce_trace(conn, key, changes)
    rows = _record_rows(key, changes)
    if len(rows) >= COPY_THRESHOLD:
        # Large groups go by COPY (about twice the rate of unnest for 1,000 rows);
        # small ones ride in the single write statement.
        await conn.copy_records_to_table("stream_records", records=rows, columns=_RECORD_COLUMNS)
        rows = []
    return stream_write(stream, changes, rows, inline)


async def after_write(conn: Connection, key: StreamKey, changes: Changes) -> None:
    """What the write statement does not hold: a soft delete, a prune, objects' intents and
    the journal's compaction after a snapshot."""
    if any(isinstance(e, StreamSoftDeleted) for e in changes.events):
        await conn.execute(SOFT_DELETED, *key)
    pruned = [e for e in changes.events if isinstance(e, RecordsPruned)]
    if pruned:
        await conn.execute(_DELETE_PRUNED, *key, pruned[-1].through_sequence)
    await project_objects(conn, key, changes.events)
    if changes.snapshot is not None:
        await schedule_compaction(conn, key, changes.snapshot.version)
