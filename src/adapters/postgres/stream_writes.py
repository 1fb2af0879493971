"""What a group of commands writes to PostgreSQL, for one stream or a batch of streams.

Everything the commands of a transaction's streams caused (records, journal rows, receipts,
consumers, input deliveries, each stream's new snapshot and its NOTIFY) goes in one statement,
`_WRITE`, whose parameters are the rows of each table (`StreamWrites`, one struct per table),
whether the transaction is one stream's group or a batch of streams (the group commit across
streams). Large groups of records go by COPY first; the rare rest (producers' rows, a soft
delete, a prune, objects' intents, a compaction job) around them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from hashlib import sha256
from typing import TypeVar

import asyncpg
import msgspec

from adapters.postgres.connections import Connection
from adapters.postgres.erasure import WAKE_CHANNEL, lock_for_deletion
from adapters.postgres.intents import PROJECTED, project_objects
from adapters.postgres.journal import schedule_compaction
from adapters.postgres.marks import MARK_WRITTEN
from adapters.postgres.producers import write_producers
from adapters.postgres.tenant_counts import COUNT_BYTES, RECEIPT_COUNT, RECORD_BYTES
from adapters.postgres.traces import TRACES_CHANNEL, trace_announcement
from application import tracing
from application.deciding import Changes
from application.input_delivery import event_bytes
from application.waiting import commit_refused, committing
from domain.events import (
    ConsumerAcknowledged,
    ConsumerRemoved,
    RecordsPruned,
    StreamSoftDeleted,
    encode_event,
    event_type,
)
from domain.records import held_bytes
from domain.state import Producer, encode_consumers, encode_state_without_consumers
from domain.stream import Stream, StreamKey

_KEY = "tenant = $1 AND run_id = $2 AND stream_id = $3"

log = logging.getLogger("ductor_streams.writes")
T = TypeVar("T")


# The rows of each table that a write adds or changes, one struct per table, its fields named as
# the table's columns: `_WRITE` reads each table's rows from one JSON array of them
# (`json_to_recordset`), bytes as base64. Arrays of each column, the shape this replaced, made
# asyncpg check every element of every array in Python (two `isinstance` calls against an ABC
# for a text or bytea element): a batch of streams with one record each spent about 14 µs of
# the server's CPU per stream encoding them, and 9 µs more building the arrays.


class StreamRow(msgspec.Struct, frozen=True):
    """The stream's row as the write leaves it: its columns and snapshot."""

    tenant: str
    run_id: str
    stream_id: str
    version: int
    head: int
    earliest: int
    closed: bool
    legal_hold: bool
    state: bytes
    write_consumers: bool  # `consumers` is written (else the column keeps its value)
    consumers: bytes | None


class RecordRow(msgspec.Struct, frozen=True):
    """A record (`stream_records`)."""

    tenant: str
    run_id: str
    stream_id: str
    sequence: int
    appended_at: datetime
    kind: int
    content_type: str
    size: int
    end_offset: int
    payload: bytes


class EventRow(msgspec.Struct, frozen=True):
    """A journal row (`stream_events`)."""

    tenant: str
    run_id: str
    stream_id: str
    version: int
    type: str
    payload: bytes


class ReceiptRow(msgspec.Struct, frozen=True):
    """An idempotent append's receipt (`append_receipts`)."""

    tenant: str
    run_id: str
    stream_id: str
    idempotency_key: str
    fingerprint: bytes
    answer: bytes


class ConsumerRow(msgspec.Struct, frozen=True):
    """A consumer the group changed, as it ends (`stream_consumers`)."""

    tenant: str
    run_id: str
    stream_id: str
    consumer_id: str
    principal: str
    acked_sequence: int
    updated_at: datetime
    holds_credit: bool


class ConsumerGone(msgspec.Struct, frozen=True):
    """A consumer the group removed."""

    tenant: str
    run_id: str
    stream_id: str
    consumer_id: str


class DeliveryRow(msgspec.Struct, frozen=True):
    """An input stream's record's delivery row (`input_deliveries`), with what its wait event
    will count (`pledge`: 0 when its append was not charged for it)."""

    tenant: str
    run_id: str
    stream_id: str
    sequence: int
    pledge: int


_encode = msgspec.json.Encoder().encode


class StreamWrites:
    """What one transaction writes for its streams (one, or a batch of the group commit across
    streams): the rows of each table, `_WRITE`'s parameters in `arguments()`'s order."""

    __slots__ = ("consumers", "deliveries", "events", "gone", "receipts", "records", "streams")

    def __init__(self) -> None:
        self.streams: list[StreamRow] = []
        self.records: list[RecordRow] = []
        self.events: list[EventRow] = []
        self.receipts: list[ReceiptRow] = []
        self.consumers: list[ConsumerRow] = []
        self.gone: list[ConsumerGone] = []
        self.deliveries: list[DeliveryRow] = []

    def add(
        self, stream: Stream, changes: Changes, records: list[RecordRow], inline: bool = False
    ) -> None:
        """What `changes` leave of `stream` (its `records` built by the caller: a large group's
        go by COPY instead). `inline`: the state was read with its consumers in the snapshot
        (written before migration 0488); they are written to their column now."""
        s, key = stream.state, stream.key
        tenant, run_id, stream_id = key
        self.records += records
        self.events += [
            EventRow(tenant, run_id, stream_id, e.version, event_type(e), encode_event(e))
            for e in changes.events
        ]
        if changes.receipts:
            self.receipts += [
                ReceiptRow(tenant, run_id, stream_id, r.key, r.fingerprint, r.answer_json)
                for r in changes.receipts
            ]
        touched = {
            e.consumer_id: None
            for e in changes.events
            if isinstance(e, ConsumerAcknowledged | ConsumerRemoved)
        }
        for consumer_id in touched:
            c = s.consumers.get(consumer_id)
            if c is None:
                self.gone.append(ConsumerGone(tenant, run_id, stream_id, consumer_id))
            else:
                self.consumers.append(
                    ConsumerRow(
                        tenant,
                        run_id,
                        stream_id,
                        consumer_id,
                        c.principal,
                        c.acked_sequence,
                        c.updated_at,
                        c.holds_credit,
                    )
                )
        if stream.definition.direction == "input":
            for appended in changes.appended:
                self.deliveries += [
                    DeliveryRow(
                        tenant,
                        run_id,
                        stream_id,
                        sequence,
                        event_bytes(stream.key, record) if appended.charged else 0,
                    )
                    for sequence, record in zip(appended.sequences, appended.records, strict=True)
                ]
        self.streams.append(
            StreamRow(
                tenant,
                run_id,
                stream_id,
                s.version,
                s.head,
                s.earliest,
                s.closed,
                s.legal_hold.enabled,
                # The producers are in rows of their own (adapters/postgres/producers.py), the
                # consumers in their column.
                encode_state_without_consumers(
                    msgspec.structs.replace(s, producers={}) if s.producers else s
                ),
                bool(touched) or inline,
                encode_consumers(s.consumers) if touched or inline else None,
            )
        )

    def arguments(self) -> list[str]:
        return [_encode(getattr(self, table)).decode() for table in _PARAMETERS]


# `_WRITE`'s parameters, in order: each a table's rows (`StreamWrites`' lists of those names).
_PARAMETERS = ("streams", "records", "events", "receipts", "consumers", "gone", "deliveries")


def _rows(name: str, columns: str) -> str:
    """A table's rows as `_WRITE` reads them: its JSON parameter as a row set, aliased by the
    name's first letter."""
    return f"json_to_recordset(${_PARAMETERS.index(name) + 1}::json) AS {name[0]}({columns})"


_KEY_COLUMNS = "tenant text, run_id text, stream_id text"
_RECORDS = _rows(
    "records",
    f"{_KEY_COLUMNS}, sequence bigint, appended_at timestamptz, kind int2, content_type text, "
    "size int4, end_offset int8, payload text",
)
_EVENTS = _rows("events", f"{_KEY_COLUMNS}, version int8, type text, payload text")
_RECEIPTS = _rows(
    "receipts", f"{_KEY_COLUMNS}, idempotency_key text, fingerprint text, answer text"
)
_CONSUMERS = _rows(
    "consumers",
    f"{_KEY_COLUMNS}, consumer_id text, principal text, acked_sequence int8, "
    "updated_at timestamptz, holds_credit boolean",
)
_GONE = _rows("gone", f"{_KEY_COLUMNS}, consumer_id text")
_DELIVERIES = _rows("deliveries", f"{_KEY_COLUMNS}, sequence bigint, pledge int4")
_STREAMS = _rows(
    "streams",
    f"{_KEY_COLUMNS}, version bigint, head bigint, earliest bigint, closed boolean, "
    "legal_hold boolean, state text, write_consumers boolean, consumers text",
)

_NEW_BYTES = (
    "SELECT tenant, size FROM new_records UNION ALL SELECT tenant, size FROM new_receipts"
    " UNION ALL SELECT tenant, size FROM deliveries WHERE size <> 0"
)

# One round trip writes everything the transaction's streams' commands caused, their NOTIFYs
# included. Data-modifying CTEs always run to completion, referenced or not; an empty array
# inserts nothing.
_WRITE = f"""
WITH new_records AS (
    INSERT INTO stream_records
        (tenant, run_id, stream_id, sequence, appended_at, kind, content_type, size, end_offset,
         payload)
    SELECT r.tenant, r.run_id, r.stream_id, r.sequence, r.appended_at, r.kind, r.content_type,
           r.size, r.end_offset, decode(r.payload, 'base64')
    FROM {_RECORDS}
    RETURNING tenant, {RECORD_BYTES} AS size
), new_receipts AS (
    INSERT INTO append_receipts (tenant, run_id, stream_id, idempotency_key, fingerprint, answer)
    SELECT r.tenant, r.run_id, r.stream_id, r.idempotency_key, decode(r.fingerprint, 'base64'),
           decode(r.answer, 'base64')
    FROM {_RECEIPTS}
    RETURNING tenant, {RECEIPT_COUNT} AS size
), new_events AS (
    INSERT INTO stream_events (tenant, run_id, stream_id, version, type, payload)
    SELECT e.tenant, e.run_id, e.stream_id, e.version, e.type, decode(e.payload, 'base64')
    FROM {_EVENTS}
), acked AS (
    INSERT INTO stream_consumers
        (tenant, run_id, stream_id, consumer_id, principal, acked_sequence, updated_at,
         holds_credit)
    SELECT c.tenant, c.run_id, c.stream_id, c.consumer_id, c.principal, c.acked_sequence,
           c.updated_at, c.holds_credit
    FROM {_CONSUMERS}
    ON CONFLICT (tenant, run_id, stream_id, consumer_id) DO UPDATE
    SET principal = excluded.principal, acked_sequence = excluded.acked_sequence,
        updated_at = excluded.updated_at, holds_credit = excluded.holds_credit
), removed AS (
    DELETE FROM stream_consumers c
    USING {_GONE}
    WHERE c.tenant = g.tenant AND c.run_id = g.run_id AND c.stream_id = g.stream_id
      AND c.consumer_id = g.consumer_id
), deliveries AS (
    INSERT INTO input_deliveries (tenant, run_id, stream_id, sequence, pledge)
    SELECT d.tenant, d.run_id, d.stream_id, d.sequence, nullif(d.pledge, 0)
    FROM {_DELIVERIES}
    RETURNING tenant, coalesce(pledge, 0) AS size
), counted AS (
    -- the records', receipts' and wait events' pledged bytes, added to their tenant's count
    -- (tenant_counts.py), in one part: two parts that changed the same count row would leave
    -- one of the changes
    {COUNT_BYTES.format(sign="", records=_NEW_BYTES)}
), written AS (
    UPDATE streams AS t
    SET version = s.version, head = s.head, earliest = s.earliest, closed = s.closed,
        legal_hold = s.legal_hold, state = decode(s.state, 'base64'),
        consumers = CASE WHEN s.write_consumers THEN decode(s.consumers, 'base64')
                         ELSE t.consumers END
    FROM {_STREAMS}
    WHERE t.tenant = s.tenant AND t.run_id = s.run_id AND t.stream_id = s.stream_id
    RETURNING s.tenant, s.run_id, s.stream_id, s.head
), marked AS (
    -- the links these streams now stand past the cursors of, marked pending (marks.py)
    {MARK_WRITTEN}
)
SELECT pg_notify('{WAKE_CHANNEL}', w.tenant || '/' || w.run_id || '/' || w.stream_id || ' '
                 || w.head::text)
FROM written w
"""


_DELETE_PRUNED = f"""
WITH pruned AS (
    DELETE FROM stream_records WHERE {_KEY} AND sequence <= $4
    RETURNING tenant, {RECORD_BYTES} AS size
)
{COUNT_BYTES.format(sign="-", records="SELECT tenant, size FROM pruned")}
"""


SOFT_DELETED = f"""
WITH unswept AS (
    -- nothing is left to expire: only the cascade of its last fork's erasure erases it
    DELETE FROM stream_access WHERE {_KEY}
), undelivered AS (
    -- a deleted input stream delivers nothing more to its workflow (its forks read its
    -- records, they are not its input), and what its events pledged is given back
    DELETE FROM input_deliveries WHERE {_KEY}
    RETURNING tenant, CASE WHEN delivered_at IS NULL THEN coalesce(pledge, 0) ELSE 0 END AS size
), unpledged AS (
    {COUNT_BYTES.format(sign="-", records="SELECT tenant, size FROM undelivered WHERE size <> 0")}
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
# A large group's records, written by COPY, added to their tenant's count.
_COUNT_COPIED = COUNT_BYTES.format(sign="", records="SELECT $1::text AS tenant, $2::int8 AS size")
COPY_THRESHOLD = 64
COPY_PIECE = 5_000  # rows a COPY statement carries (about 12 ms of encoding here)

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
    writes = StreamWrites()
    await before_write(conn, writes, key, stream, changes, producers, inline)
    await execute_writes(conn, writes)
    if has_after_write(changes):
        await after_write(conn, key, changes)


async def execute_writes(conn: Connection, writes: StreamWrites) -> None:
    """`_WRITE`: what one transaction's streams' commands caused, in one statement."""
    await conn.execute(_WRITE, *writes.arguments())


# `_WRITE` prepared under a name on each pooled connection (`prepare_session`, the pool's init),
# so that the write and its COMMIT go to PostgreSQL in one simple query; and `_LOCK_KNOWN`, so
# that `BEGIN` and the row lock go in one too. A round trip costs this process about 50 µs of
# CPU (asyncpg on uvloop); a hot stream's commit made four (`BEGIN`, the lock, the write,
# `COMMIT`) and now makes two. The rows travel in the statement's text, as psycopg2 sends every
# parameter: PostgreSQL's log shows them where it logs a failing statement's text
# (`log_min_error_statement`; docs/configuration.md, "What PostgreSQL sees").
WRITE_STATEMENT = "ductor_streams_write"
LOCK_STATEMENT = "ductor_streams_lock"
LOCK_MANY_STATEMENT = "ductor_streams_lock_many"

# A stream's row locked if its state still hashes as this process last wrote it (the state
# holds the stream's version and creation time): a simple query answers its last statement's
# count, not its rows, so the count says whether it did. (A row that another transaction
# changed meanwhile may stay locked without being counted: the caller then reads it, and takes
# no other lock.)
_LOCK_KNOWN = """
SELECT 1 FROM streams
WHERE tenant = $1 AND run_id = $2 AND stream_id = $3 AND sha256(state) = decode($4, 'hex')
FOR NO KEY UPDATE
"""

# A batch's rows, every one locked in the key's order (as `_LOCK_MANY` locks them), counted
# where the state still hashes as this process last wrote it: the count says whether they all
# did. Each row is locked whether or not it matches, so that the caller, reading the others'
# state, takes no lock out of the key's order. Materialized: the locks are taken whatever the
# outer query keeps.
_LOCK_KNOWN_MANY = """
WITH locked AS MATERIALIZED (
    SELECT sha256(s.state) = decode(k.digest, 'hex') AS same
    FROM json_to_recordset($1::json) AS k(tenant text, run_id text, stream_id text, digest text)
    JOIN streams s ON s.tenant = k.tenant AND s.run_id = k.run_id AND s.stream_id = k.stream_id
    ORDER BY s.tenant, s.run_id, s.stream_id
    FOR NO KEY UPDATE OF s
)
SELECT 1 FROM locked WHERE same
"""


class _KnownRow(msgspec.Struct, frozen=True):
    tenant: str
    run_id: str
    stream_id: str
    digest: str  # SHA-256 of the state, hex


_PREPARED = {
    WRITE_STATEMENT: f"PREPARE {WRITE_STATEMENT}({', '.join('json' for _ in _PARAMETERS)}) "
    f"AS {_WRITE}",
    LOCK_STATEMENT: f"PREPARE {LOCK_STATEMENT}(text, text, text, text) AS {_LOCK_KNOWN}",
    LOCK_MANY_STATEMENT: f"PREPARE {LOCK_MANY_STATEMENT}(json) AS {_LOCK_KNOWN_MANY}",
}


async def prepare_session(conn: Connection) -> None:
    """Prepare `_WRITE` and `_LOCK_KNOWN` on `conn` (those it does not hold yet): the pool's
    `init` (`prepare_pooled`), and a write's on a connection without them."""
    held = await conn.fetch(
        "SELECT name FROM pg_prepared_statements WHERE name = ANY($1::text[])", list(_PREPARED)
    )
    missing = set(_PREPARED) - {r[0] for r in held}
    if missing:
        await conn.execute(";".join(_PREPARED[name] for name in sorted(missing)))


async def prepare_pooled(conn: Connection) -> None:
    """The pool's `init`: `prepare_session`, unless the schema cannot have it yet (a connection
    opened before the migrations ran): then its first write prepares them, or says why not."""
    try:
        await prepare_session(conn)
    except asyncpg.PostgresError as error:
        log.warning("the write statements were not prepared on a new connection: %s", error)


async def with_statements(conn: Connection, transaction: Callable[[], Awaitable[T]]) -> T:
    """Run `transaction` on `conn`; if the connection lacks this module's prepared statements
    (a pool without `prepare_pooled`), the server refused it whole (rolled back): prepare them
    and run it again."""
    try:
        return await transaction()
    except asyncpg.InvalidSQLStatementNameError as error:
        if not any(name in str(error) for name in _PREPARED):
            raise
    commit_refused()  # (its COMMIT, if sent, was refused: nothing was committed)
    await prepare_session(conn)
    return await transaction()


_encode_known = msgspec.json.Encoder().encode


def _literal(text: str) -> str:
    """`text` as a string constant of a simple query, taken as it is whatever the server's
    `standard_conforming_strings`: dollar-quoted when it holds no `$` (base64 and most JSON),
    else an escape string."""
    if "$" not in text:
        return f"$w${text}$w$"
    return "E'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


class Transaction:
    """A write transaction in as few round trips as it can: `BEGIN` on entry, with the row of
    `key` locked in the same round trip when `state` is given (the state this process last
    wrote there; `locked` says whether the row still held it, so that it need not be read), or
    with a batch's rows when `known` gives each one's key and state (`locked`: every one still
    held its state; each is locked either way, in the key's order); `commit(writes)` sends
    `_WRITE` and `COMMIT` as one simple query (if the write fails, the server skips the
    COMMIT). Any error rolls it back.

    asyncpg's own transaction would send its COMMIT alone, a round trip more, so `BEGIN` and
    `ROLLBACK` are sent here as its would be."""

    __slots__ = ("_conn", "_key", "_known", "_open", "_state", "locked")

    def __init__(
        self,
        conn: Connection,
        key: StreamKey | None = None,
        state: bytes | None = None,
        known: Sequence[tuple[StreamKey, bytes]] | None = None,
    ) -> None:
        self._conn = conn
        self._key = key
        self._state = state
        self._known = known
        self._open = False
        self.locked = False

    async def __aenter__(self) -> Transaction:
        key, state, conn = self._key, self._state, self._conn
        try:
            if self._known:
                rows = [_KnownRow(*k, sha256(s).hexdigest()) for k, s in self._known]
                argument = _literal(_encode_known(rows).decode())
                status = await conn.execute(f"BEGIN; EXECUTE {LOCK_MANY_STATEMENT}({argument})")
                self.locked = status == f"SELECT {len(rows)}"
            elif key is None or state is None:
                await conn.execute("BEGIN")
            else:
                arguments = ", ".join(_literal(a) for a in key)
                digest = sha256(state).hexdigest()
                status = await conn.execute(
                    f"BEGIN; EXECUTE {LOCK_STATEMENT}({arguments}, '{digest}')"
                )
                self.locked = status == "SELECT 1"
        except BaseException:
            await self._roll_back()  # (the BEGIN may have been run)
            raise
        self._open = True
        return self

    async def commit(self, writes: StreamWrites | None = None) -> None:
        """COMMIT, with `writes` (when given) in the same round trip. From here on a failure's
        outcome is unknown (`committing`)."""
        self._open = False
        committing()
        if writes is None:
            await self._conn.execute("COMMIT")
            return
        arguments = ", ".join(_literal(a) for a in writes.arguments())
        await self._conn.execute(f"EXECUTE {WRITE_STATEMENT}({arguments}); COMMIT")

    async def __aexit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            if self._open:
                await self.commit()
            return
        await self._roll_back()

    async def _roll_back(self) -> None:
        # Whatever asyncpg last heard of the transaction's state (a cancelled statement may
        # not have told it yet): outside a transaction ROLLBACK is only a warning. If it
        # fails, the pool's release rolls back again, or closes the connection; a connection
        # lost meanwhile (PostgreSQL restarted) may already be released, and even asking it
        # raises: the error that ended the transaction is the one that counts.
        with contextlib.suppress(Exception):
            if not self._conn.is_closed():
                await self._conn.execute("ROLLBACK")


async def commit_writes(
    conn: Connection,
    transaction: Transaction,
    writes: StreamWrites,
    after: list[tuple[StreamKey, Changes]],
) -> None:
    """Commit `writes` (rows `before_write` added for the transaction's streams) with the
    statements that must follow `_WRITE` for the streams' `after` changes (`has_after_write`):
    `_WRITE` goes with the COMMIT unless there are any."""
    if not writes.streams:
        await transaction.commit()
        return
    if not after:
        await transaction.commit(writes)
        return
    await execute_writes(conn, writes)
    for key, changes in after:
        await after_write(conn, key, changes)
    await transaction.commit()


# Events after which `after_write` has a statement to run (with a snapshot: the compaction job).
_AFTER = (StreamSoftDeleted, *PROJECTED)


def has_after_write(changes: Changes) -> bool:
    """Whether `after_write` has anything to do: most groups (appends alone) have not, and
    skip the call (a batch of streams makes it once per stream)."""
    return changes.snapshot is not None or any(isinstance(e, _AFTER) for e in changes.events)


async def before_write(
    conn: Connection,
    writes: StreamWrites,
    key: StreamKey,
    stream: Stream,
    changes: Changes,
    producers: dict[str, Producer] | None,
    inline: bool,
) -> None:
    """The producers' rows and a large group's records (by COPY), then the rest of what the
    stream's commands caused added to `writes` (the producers first: a snapshot takes them
    all)."""
    if producers or stream.state.producers or changes.snapshot is not None:
        # (with none loaded and none now, only a snapshot has producers to write: all of them)
        await write_producers(conn, key, producers or {}, stream.state.producers, changes)
    if changes.appended and tracing.on():
        await announce_trace(conn, key, changes)
    rows = _record_rows(key, changes)
    if len(rows) >= COPY_THRESHOLD:
        # Large groups go by COPY (about twice the rate of unnest for 1,000 rows);
        # small ones ride in the single write statement. asyncpg encodes a COPY's rows in one
        # go: 100,000 held this process's event loop for 0.2-0.5 s, every other request with
        # it. In pieces, the loop serves the others between them (a round trip more a piece).
        for start in range(0, len(rows), COPY_PIECE):
            await conn.copy_records_to_table(
                "stream_records", records=rows[start : start + COPY_PIECE], columns=_RECORD_COLUMNS
            )
        copied = sum(held_bytes(r) for appended in changes.appended for r in appended.records)
        await conn.execute(_COUNT_COPIED, key.tenant, copied)
        rows = []
    writes.add(stream, changes, [RecordRow(*row) for row in rows], inline)


async def after_write(conn: Connection, key: StreamKey, changes: Changes) -> None:
    """What the write statement does not hold: a soft delete, a prune, objects' intents and
    the journal's compaction after a snapshot."""
    if any(isinstance(e, StreamSoftDeleted) for e in changes.events):
        await lock_for_deletion(conn, key.tenant, key.run_id, [key.stream_id])
        await conn.execute(SOFT_DELETED, *key)
    pruned = [e for e in changes.events if isinstance(e, RecordsPruned)]
    if pruned:
        await conn.execute(_DELETE_PRUNED, *key, pruned[-1].through_sequence)
    await project_objects(conn, key, changes.events)
    if changes.snapshot is not None:
        await schedule_compaction(conn, key, changes.snapshot.version)
