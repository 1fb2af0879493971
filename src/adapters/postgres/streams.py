"""Streams, their journal, records and receipts in PostgreSQL.

`update` is the only writer of a stream's state. It takes the stream-row lock
(`SELECT … FOR UPDATE`), so every process and replica that appends, acknowledges or closes the
same stream queues on that one row: sequences, credit and receipts are decided against committed
state and nothing else. Everything the commands caused — journal rows, records, receipts,
consumers and the new snapshot — is written by one statement, and the NOTIFY rides in the same
transaction, so a listener can never be woken before the records it will reread are visible.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from itertools import islice

import asyncpg
import msgspec

from adapters.postgres.bounded import bounded
from adapters.postgres.cleanup import aged_rows, delete_in_batches
from adapters.postgres.connections import Connection
from adapters.postgres.erasure import WAKE_CHANNEL, erase
from adapters.postgres.intents import project_objects, read_expired_intents, read_intent
from adapters.postgres.journal import read_journal, schedule_compaction
from adapters.postgres.producers import all_producers, producers_for, write_producers
from adapters.postgres.traces import TRACES_CHANNEL, trace_announcement
from application import tracing
from application.deciding import SNAPSHOT_EVERY, Changes, Receipt, decide_all
from application.errors import NotFound
from application.fork_reads import (
    ForkLink,
    check_fork_source,
    kept_by_forks,
    segments,
    stitched,
)
from application.ports import (
    Command,
    ConsumerPosition,
    Failed,
    Outcome,
    Position,
    RunSummary,
    StoredRecord,
)
from application.retention import PruneCommand, expired_prefix, has_retention
from application.waiting import committing
from application.wake import WakeRegistry
from domain.definition import Fork, StreamDefinition
from domain.events import (
    ConsumerAcknowledged,
    ConsumerRemoved,
    Event,
    RecordsPruned,
    StreamDeleted,
    StreamSoftDeleted,
    encode_event,
    event_type,
)
from domain.objects import ObjectIntent
from domain.records import RecordKind
from domain.state import (
    ConsumersNotLoaded,
    Producer,
    decode_consumers,
    encode_consumers,
    encode_state_without_consumers,
)
from domain.stream import (
    Stream,
    StreamKey,
    StreamState,
    decode_definition,
    decode_state,
    encode_definition,
    encode_state,
)

__all__ = ["WAKE_CHANNEL", "PostgresStreams"]

_KEY = "tenant = $1 AND run_id = $2 AND stream_id = $3"

_INSERT_STREAM = """
WITH created AS (
    INSERT INTO streams (tenant, run_id, stream_id, definition, created_at, version, state)
    VALUES ($1, $2, $3, $4, $5, 1, $6)
    ON CONFLICT (tenant, run_id, stream_id) DO NOTHING
    RETURNING tenant, run_id, stream_id
), scheduled AS (
    INSERT INTO retention_jobs (tenant, run_id, stream_id)
    SELECT tenant, run_id, stream_id FROM created WHERE $8::boolean
), accessed AS (
    -- expiry (migration 0482): the creation is the first access
    INSERT INTO stream_access
        (tenant, run_id, stream_id, last_access_at, idle_seconds, expires_at, due_at)
    SELECT tenant, run_id, stream_id, $5, $9::bigint, $10::timestamptz,
           COALESCE($10::timestamptz, $5 + $9::bigint * interval '1 second')
    FROM created WHERE $9::bigint IS NOT NULL OR $10::timestamptz IS NOT NULL
    ON CONFLICT (tenant, run_id, stream_id) DO UPDATE
    SET last_access_at = excluded.last_access_at, idle_seconds = excluded.idle_seconds,
        expires_at = excluded.expires_at, due_at = excluded.due_at
)
INSERT INTO stream_events (tenant, run_id, stream_id, version, type, payload)
SELECT tenant, run_id, stream_id, 1, 'stream_created', $7 FROM created
RETURNING 1
"""

_LOCK = f"""
SELECT state, CASE WHEN $4::boolean THEN definition END,
       CASE WHEN $5::boolean THEN COALESCE(consumers, '{{}}'::bytea) END
FROM streams WHERE {_KEY} FOR UPDATE
"""

# The consumers, apart from the snapshot (migration 0488): read only by a decision that needs
# them (an ack, a removal, a snapshot, a stream document), never by an append.
_CONSUMERS = f"SELECT consumers FROM streams WHERE {_KEY}"

_CONSUMER_PAGE = f"""
SELECT consumer_id, acked_sequence, holds_credit FROM stream_consumers
WHERE {_KEY} AND consumer_id > $4 ORDER BY consumer_id LIMIT $5
"""

_RECEIPTS = f"""
SELECT idempotency_key, fingerprint, answer FROM append_receipts
WHERE {_KEY} AND idempotency_key = ANY($4::text[])
"""

# By physical row, so each batch is one short statement however many receipts are due.
# A held stream's receipts stay (a hold removes nothing); the hold is read with a plain SELECT,
# so the sweep never waits for or takes a stream-row lock. Oldest first from $3, where the last
# batch ended, so held receipts are passed over once per sweep (delete_in_batches).
_FORGET_RECEIPTS = aged_rows("append_receipts", "ctid", "created_at")

_OFFSETS = f"""
SELECT sequence, end_offset FROM stream_records WHERE {_KEY} AND sequence = ANY($4::bigint[])
"""

# One round trip writes everything a group of commands caused. Data-modifying CTEs always run to
# completion, referenced or not; empty arrays insert nothing.
_WRITE = f"""
WITH new_records AS (
    INSERT INTO stream_records
        (tenant, run_id, stream_id, sequence, appended_at, kind, content_type, size, end_offset,
         payload)
    SELECT $1, $2, $3, r.sequence, r.appended_at, r.kind, r.content_type, r.size, r.end_offset,
           r.payload
    FROM unnest($4::bigint[], $5::timestamptz[], $6::int2[], $7::text[], $8::int4[], $9::int8[],
                $10::bytea[])
         AS r(sequence, appended_at, kind, content_type, size, end_offset, payload)
), new_events AS (
    INSERT INTO stream_events (tenant, run_id, stream_id, version, type, payload)
    SELECT $1, $2, $3, e.version, e.type, e.payload
    FROM unnest($11::int8[], $12::text[], $13::bytea[]) AS e(version, type, payload)
), new_receipts AS (
    INSERT INTO append_receipts (tenant, run_id, stream_id, idempotency_key, fingerprint, answer)
    SELECT $1, $2, $3, x.k, x.f, x.a
    FROM unnest($14::text[], $15::bytea[], $16::bytea[]) AS x(k, f, a)
), acked AS (
    -- each consumer the group changed, as it ends (one row per ID), or gone ($29)
    INSERT INTO stream_consumers
        (tenant, run_id, stream_id, consumer_id, principal, acked_sequence, updated_at,
         holds_credit)
    SELECT $1, $2, $3, c.id, c.principal, c.seq, c.at, c.holds
    FROM unnest($17::text[], $18::text[], $19::int8[], $20::timestamptz[], $28::boolean[])
         AS c(id, principal, seq, at, holds)
    ON CONFLICT (tenant, run_id, stream_id, consumer_id) DO UPDATE
    SET principal = excluded.principal, acked_sequence = excluded.acked_sequence,
        updated_at = excluded.updated_at, holds_credit = excluded.holds_credit
), removed AS (
    DELETE FROM stream_consumers WHERE {_KEY} AND consumer_id = ANY($29::text[])
), deliveries AS (
    -- input streams: each record's delivery row commits with the record
    INSERT INTO input_deliveries (tenant, run_id, stream_id, sequence)
    SELECT $1, $2, $3, d FROM unnest($27::bigint[]) AS d
)
UPDATE streams
SET version = $21::bigint, head = $22::bigint, earliest = $23::bigint, closed = $24::boolean,
    legal_hold = $25::boolean, state = $26::bytea,
    consumers = CASE WHEN $30::boolean THEN $31::bytea ELSE consumers END
WHERE {_KEY}
RETURNING pg_notify('{WAKE_CHANNEL}', $1 || '/' || $2 || '/' || $3 || ' ' || ($22::bigint)::text)
"""


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


# The attributes of a transaction's span (OpenTelemetry's database conventions).
_DB = {"db.system.name": "postgresql", "db.operation.name": "transaction"}

_DELETE_PRUNED = f"DELETE FROM stream_records WHERE {_KEY} AND sequence <= $4"

_EXPIRED = f"""
SELECT sequence, appended_at FROM stream_records
WHERE {_KEY} AND sequence > $4 ORDER BY sequence LIMIT $5
"""

# The stream's position (and fork link) once, in the first row, then one row per record: the
# position's columns repeated on every record row cost asyncpg a decode each (created_at a
# datetime) per record. One statement, one snapshot; the CTE is evaluated once.
_PAGE = """
WITH s AS (
    SELECT s.head, s.earliest, s.closed, s.created_at, s.soft_deleted,
           f.source_run_id, f.source_stream_id, f.source_created_at, f.through
    FROM streams s
    LEFT JOIN stream_forks f
           ON f.tenant = s.tenant AND f.run_id = s.run_id AND f.stream_id = s.stream_id
    WHERE s.tenant = $1 AND s.run_id = $2 AND s.stream_id = $3
)
SELECT s.*, NULL::bigint, NULL::bytea, NULL::int2, NULL::text, NULL::int4, NULL::bytea FROM s
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       r.sequence, timestamptz_send(r.appended_at), r.kind, r.content_type, r.size, r.payload
FROM s CROSS JOIN LATERAL (
    SELECT sequence, appended_at, kind, content_type, size, payload
    FROM stream_records r
    WHERE r.tenant = $1 AND r.run_id = $2 AND r.stream_id = $3
      AND r.sequence > $4 AND r.sequence <= s.head
    ORDER BY r.sequence
    LIMIT $5
) r
"""
# A fork's chain, its own link first, up to the root: resolved once per fork and kept (it never
# changes while the fork exists). The bound only guards against a cycle, which no creation can
# make (a fork links a stream that existed before it).
_CHAIN = """
WITH RECURSIVE chain(n, source_run_id, source_stream_id, source_created_at, through) AS (
    SELECT 0, source_run_id, source_stream_id, source_created_at, through FROM stream_forks
    WHERE tenant = $1 AND run_id = $2 AND stream_id = $3
    UNION ALL
    SELECT c.n + 1, f.source_run_id, f.source_stream_id, f.source_created_at, f.through
    FROM chain c JOIN stream_forks f
      ON f.tenant = $1 AND f.run_id = c.source_run_id AND f.stream_id = c.source_stream_id
    WHERE c.n < $4
)
SELECT source_run_id, source_stream_id, source_created_at, through FROM chain ORDER BY n
"""
_CHAIN_BOUND = 100_000

# What a fork's read takes from its ancestors, in one statement whatever the chain's depth: each
# ancestor's position (n, earliest, created_at), then the records of each segment that is not
# empty (n, then a record's columns where _PAGE has them: one decoding loop for both). `n` is
# the ancestor's place in the chain (1: the source).
_SEGMENTS = """
WITH c AS (
    SELECT * FROM unnest($2::text[], $3::text[], $4::int8[], $5::int8[])
        WITH ORDINALITY AS c(run_id, stream_id, after, through, n)
)
SELECT c.n, s.earliest, s.created_at, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL::bigint, NULL::bytea, NULL::int2, NULL::text, NULL::int4, NULL::bytea
FROM c JOIN streams s ON s.tenant = $1 AND s.run_id = c.run_id AND s.stream_id = c.stream_id
UNION ALL
SELECT c.n, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       r.sequence, timestamptz_send(r.appended_at), r.kind, r.content_type, r.size, r.payload
FROM (SELECT * FROM c WHERE c.after < c.through) c CROSS JOIN LATERAL (
    SELECT sequence, appended_at, kind, content_type, size, payload
    FROM stream_records r
    WHERE r.tenant = $1 AND r.run_id = c.run_id AND r.stream_id = c.stream_id
      AND r.sequence > c.after AND r.sequence <= c.through
    ORDER BY r.sequence
    LIMIT $6
) r
"""

# A page's appended_at arrives as timestamptz_send's 8 bytes (microseconds since 2000-01-01 UTC)
# and is decoded once per distinct value: the records of one append share theirs, and decoding
# every row's into a datetime was a tenth of a catch-up's CPU (docs/architecture.md).
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_KINDS = tuple(RecordKind)  # RecordKind(n) per row cost more than the rest of the row


# Forks: the source row is locked after the fork's is inserted (child before parent, the order
# erasure's cascade takes them in), so a delete of the source either commits first (the fork
# finds no source: 404) or sees the link (a soft delete).
_LOCK_SOURCE = f"SELECT state FROM streams WHERE {_KEY} FOR UPDATE"

_LINK = """
INSERT INTO stream_forks
    (tenant, run_id, stream_id, source_run_id, source_stream_id, source_created_at, through)
VALUES ($1, $2, $3, $4, $5, $6, $7)
"""

# Separate statements after the row lock is taken, so their snapshots see a link committed
# while the lock was awaited (a fork's creation locks its source's row before it links).
_FORK_FACTS = """
SELECT count(*) > 0, COALESCE(max(through), 0) FROM stream_forks
WHERE tenant = $1 AND source_run_id = $2 AND source_stream_id = $3
"""

_HAS_FORKS = """
SELECT EXISTS (SELECT 1 FROM stream_forks
               WHERE tenant = $1 AND source_run_id = $2 AND source_stream_id = $3)
"""

_SOFT_DELETED = f"""
WITH unswept AS (
    -- nothing is left to expire: only the cascade of its last fork's erasure erases it
    DELETE FROM stream_access WHERE {_KEY}
)
UPDATE streams SET soft_deleted = true WHERE {_KEY}
"""

_LOCK_RELEASED = f"SELECT definition, state FROM streams WHERE {_KEY} FOR UPDATE"

_RUN_FORKS = """
SELECT source_stream_id, run_id, stream_id FROM stream_forks
WHERE tenant = $1 AND source_run_id = $2
"""

# A keyset page over the primary key (tenant, run_id, stream_id): an index range scan that stops
# after `limit` rows (LIMIT NULL is no limit), whatever the size of the run.
_RUN_STREAMS = """
SELECT stream_id, definition, state, consumers FROM streams
WHERE tenant = $1 AND run_id = $2 AND stream_id > $3 ORDER BY stream_id LIMIT $4
"""

_RUN_LOCK = """
SELECT stream_id, definition, state FROM streams
WHERE tenant = $1 AND run_id = $2 ORDER BY stream_id FOR UPDATE
"""

# A keyset page over the primary key (tenant, run_id, stream_id): one group per run. A prefix
# starts the range at itself (run_id >= prefix keeps it an index range) and ends it at the first
# run_id that does not start with it.
_RUNS = """
SELECT run_id, count(*), min(created_at) FROM streams
WHERE tenant = $1 AND run_id > $2 AND NOT soft_deleted
  AND run_id >= $4 AND starts_with(run_id, $4)
GROUP BY run_id ORDER BY run_id LIMIT $3
"""


class PostgresStreams:
    def __init__(
        self,
        pool: asyncpg.Pool,
        wake: WakeRegistry | None = None,
        snapshot_every: int = SNAPSHOT_EVERY,
    ) -> None:
        self._pool = pool
        self._snapshot_every = snapshot_every
        # Decoded definitions, with the creation time of the stream they belong to: a stream
        # deleted and created again under the same key is another stream, so an entry is used
        # only where that time is known to match, or until the deleted notification drops it.
        self._definitions: dict[StreamKey, tuple[datetime, StreamDefinition]] = {}
        self._times: dict[bytes, datetime] = {}  # page(): appended_at by its timestamptz_send
        # Forks' chains (`_CHAIN`), with the creation time of the fork they belong to.
        self._chains: dict[StreamKey, tuple[datetime, list[ForkLink]]] = {}
        if wake is not None:  # the wake bus hears deletions on every replica
            wake.on_deleted(self.forget)
            wake.on_missed(self.forget_all)

    def forget(self, key: StreamKey) -> None:
        """The stream was deleted (here or on another replica): drop what is kept of it."""
        self._definitions.pop(key, None)
        self._chains.pop(key, None)

    def forget_all(self) -> None:
        """Deleted notifications may have been missed (the listen connection dropped)."""
        self._definitions.clear()
        self._chains.clear()

    async def create(
        self,
        key: StreamKey,
        definition: StreamDefinition,
        now: datetime,
        then: Sequence[Command] = (),
    ) -> tuple[Stream, bool]:
        stream, event = Stream.create(key, definition, now)
        arguments = (
            *key,
            encode_definition(definition),
            now,
            encode_state(stream.state),
            encode_event(event),
            has_retention(definition),
            definition.expiry.idle_seconds,
            definition.expiry.expires_at,
        )
        if then or definition.fork is not None:
            created = await bounded(self._create_then(stream, arguments, then))
        else:
            created = await self._pool.fetchval(_INSERT_STREAM, *arguments)
        if created:
            return stream, True
        existing = await self.load(key)
        if existing is None:  # deleted meanwhile: the ID is free again
            return await self.create(key, definition, now, then)
        return existing, False

    async def _create_then(
        self, stream: Stream, arguments: tuple[object, ...], then: Sequence[Command]
    ) -> bool:
        """Insert the stream row and write what `then` causes in the same transaction. Until it
        commits nobody else sees the row (a concurrent create of the key waits on the insert),
        so the commands are decided without a `FOR UPDATE`; the write's NOTIFY wakes readers
        at the commit, as after `update`. A failing command rolls the creation back."""
        with tracing.span("postgresql transaction", kind="client", attributes=_DB):
            return await self._create_then_in(stream, arguments, then)

    async def _create_then_in(
        self, stream: Stream, arguments: tuple[object, ...], then: Sequence[Command]
    ) -> bool:
        async with self._pool.acquire() as conn, conn.transaction():
            if not await conn.fetchval(_INSERT_STREAM, *arguments):
                return False
            fork = stream.definition.fork
            if fork is not None:  # the source locked after the fork's row: child before parent
                await _link_fork(conn, stream.key, fork)
                # The row's head and earliest columns (what pages read) start where the fork's
                # state does, at its fork point, not at the columns' defaults (0 and 1).
                await conn.execute(
                    f"UPDATE streams SET head = $4, earliest = $5 WHERE {_KEY}",
                    *stream.key,
                    stream.state.head,
                    stream.state.earliest,
                )
            if not then:
                return True
            outcomes, changes = decide_all(stream, then, {}, {}, self._snapshot_every)
            for outcome in outcomes:
                if isinstance(outcome, Failed):
                    raise outcome.error
            assert not changes.deleted
            await self._write(conn, stream.key, stream, changes)
            committing()
        return True

    async def load(self, key: StreamKey) -> Stream | None:
        """The whole stream, its producers and consumers included (the producers from their
        own rows, in the same snapshot: repeatable read makes the two statements one)."""
        async with (
            self._pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            row = await conn.fetchrow(
                f"SELECT definition, state, consumers FROM streams WHERE {_KEY}", *key
            )
            if row is None:
                return None
            state = _with_consumers(row["state"], row["consumers"])
            state.producers = await all_producers(conn, key)
        return Stream(key, self._definition(key, state, row["definition"]), state)

    async def consumers(
        self, key: StreamKey, after: str | None, limit: int
    ) -> list[ConsumerPosition]:
        rows = await self._pool.fetch(_CONSUMER_PAGE, *key, after or "", limit)
        return [ConsumerPosition(r[0], r[1], r[2]) for r in rows]

    def _definition(
        self, key: StreamKey, state: StreamState, payload: bytes | None
    ) -> StreamDefinition:
        """Definitions are immutable, so decoded ones are kept (the oldest dropped past 10k),
        each with its stream's creation time: `state` says which stream this is."""
        known = self._definitions.get(key)
        if known is not None and known[0] == state.created_at:
            return known[1]
        assert payload is not None and state.created_at is not None
        definition = decode_definition(payload)
        self._definitions[key] = (state.created_at, definition)
        if len(self._definitions) > 10_000:
            del self._definitions[next(iter(self._definitions))]
        return definition

    async def list_run(
        self, tenant: str, run_id: str, after: str | None = None, limit: int | None = None
    ) -> list[Stream]:
        rows = await self._pool.fetch(_RUN_STREAMS, tenant, run_id, after or "", limit)
        streams = []
        for r in rows:
            key = StreamKey(tenant, run_id, r["stream_id"])
            state = _with_consumers(r["state"], r["consumers"])
            streams.append(Stream(key, self._definition(key, state, r["definition"]), state))
        return streams

    async def definition(self, key: StreamKey) -> StreamDefinition | None:
        if (known := self._definitions.get(key)) is not None:
            return known[1]
        row = await self._pool.fetchrow(
            f"SELECT definition, created_at FROM streams WHERE {_KEY}", *key
        )
        if row is None:
            return None
        definition = decode_definition(row[0])
        self._definitions[key] = (row[1], definition)
        return definition

    async def created_at(self, key: StreamKey) -> datetime | None:
        if (known := self._definitions.get(key)) is not None:
            return known[0]
        await self.definition(key)
        known = self._definitions.get(key)
        return None if known is None else known[0]

    async def update(self, key: StreamKey, commands: Sequence[Command]) -> list[Outcome]:
        # Bounded as a whole (adapters/postgres/bounded.py): a silent connection costs the group
        # the bound, and a failure once COMMIT is sent is reported as of unknown outcome.
        return await bounded(self._update(key, commands))

    async def _update(self, key: StreamKey, commands: Sequence[Command]) -> list[Outcome]:
        with tracing.span("postgresql transaction", kind="client", attributes=_DB):
            return await self._update_in(key, commands)

    async def _update_in(self, key: StreamKey, commands: Sequence[Command]) -> list[Outcome]:
        async with self._pool.acquire() as conn, conn.transaction():
            # Never touch the pool while holding the row lock: with every connection waiting
            # on this row, a second acquire by the holder would wait forever.
            needs_consumers = any(getattr(c, "needs_consumers", False) for c in commands)
            row = await conn.fetchrow(_LOCK, *key, key not in self._definitions, needs_consumers)
            if row is None:
                raise NotFound(f"no stream {key.stream_id!r} in run {key.run_id!r}")
            state, payload = decode_state(row[0]), row[1]
            known = self._definitions.get(key)
            if payload is None and (known is None or known[0] != state.created_at):
                # Evicted meanwhile, or kept for a deleted stream of the same ID.
                payload = await conn.fetchval(f"SELECT definition FROM streams WHERE {_KEY}", *key)
            definition = self._definition(key, state, payload)
            # A snapshot written before migration 0488 still carries its consumers: this
            # write moves them to their column.
            inline = bool(state.consumers)
            # Only the producers this group names (and, near the bound, the least recent).
            producers, unloaded = await producers_for(conn, key, commands)
            receipts: dict[str, Receipt] = {}
            if keys := [c.idempotency.key for c in commands if c.idempotency is not None]:
                for r in await conn.fetch(_RECEIPTS, *key, keys):
                    receipts[r[0]] = Receipt(r[0], r[1], r[2])
            await _check_fences(conn, key, commands)
            offsets: dict[int, int] = {}
            if wanted := [c.offset_of for c in commands if c.offset_of is not None]:
                # Each row is a (sequence, end offset) pair; asyncpg-stubs' Record is no pair.
                offsets = dict(await conn.fetch(_OFFSETS, *key, wanted))  # type: ignore[arg-type]
            # Read with the lock when a command says it needs them, else once a decision does.
            consumers: bytes | None = None if inline else row[2]
            forked, pinned_through = False, 0

            async def decide() -> tuple[Stream, list[Outcome], Changes]:
                # From the state as locked, each time: a decision that needs the consumers
                # raises before anything is written, and is decided again with them.
                nonlocal consumers
                for _ in range(2):
                    locked = _with_consumers(row[0], consumers)
                    locked.producers = dict(producers)
                    stream = Stream(
                        key,
                        definition,
                        locked,
                        forked=forked,
                        pinned_through=pinned_through,
                        unloaded_producers=unloaded,
                    )
                    try:
                        return stream, *decide_all(
                            stream, commands, dict(receipts), offsets, self._snapshot_every
                        )
                    except ConsumersNotLoaded:
                        if consumers is not None or inline:
                            raise
                        consumers = await conn.fetchval(_CONSUMERS, *key) or b"{}"
                raise AssertionError("unreachable")

            stream, outcomes, changes = await decide()
            if changes.deleted or any(isinstance(e, RecordsPruned) for e in changes.events):
                facts = await conn.fetchrow(_FORK_FACTS, *key)
                assert facts is not None  # aggregates without GROUP BY: always one row
                forked, pinned_through = facts
                if forked:
                    # Forks still read it: decided again knowing that (a delete is a soft
                    # delete; retention keeps what they inherit), from the state as locked.
                    # Only a delete, an expiry or a prune pays this query.
                    stream, outcomes, changes = await decide()
            released: list[StreamKey] = []
            if changes.deleted:
                # Erased with everything it holds; what the group decided before the delete is
                # erased with it (those requests were answered as if committed just before).
                [deleted] = [e for e in changes.events if isinstance(e, StreamDeleted)]
                await erase(conn, *key[:2], [key.stream_id], deleted.reason)
                released = await _release_sources(conn, key, stream.definition.fork, deleted.at)
            elif changes.events:
                await self._write(conn, key, stream, changes, producers, inline)
            committing()
        if changes.deleted:
            for erased in (key, *released):
                self.forget(erased)
        return outcomes

    @staticmethod
    async def _write(
        conn: Connection,
        key: StreamKey,
        stream: Stream,
        changes: Changes,
        producers: dict[str, Producer] | None = None,
        inline: bool = False,
    ) -> None:
        """Write what a transaction's commands caused, its NOTIFY included. `producers`: those
        loaded before the commands were decided."""
        await write_producers(conn, key, producers or {}, stream.state.producers, changes)
        rows = _record_rows(key, changes)
        if len(rows) >= COPY_THRESHOLD:
            # Large groups go by COPY (about twice the rate of unnest for 1,000 rows);
            # small ones ride in the single write statement below.
            await conn.copy_records_to_table(
                "stream_records", records=rows, columns=_RECORD_COLUMNS
            )
            rows = []
        if changes.appended and tracing.on():
            await announce_trace(conn, key, changes)
        await conn.execute(_WRITE, *key, *_write_arguments(stream, changes, rows, inline))
        if any(isinstance(e, StreamSoftDeleted) for e in changes.events):
            await conn.execute(_SOFT_DELETED, *key)
        pruned = [e for e in changes.events if isinstance(e, RecordsPruned)]
        if pruned:
            await conn.execute(_DELETE_PRUNED, *key, pruned[-1].through_sequence)
        await project_objects(conn, key, changes.events)
        if changes.snapshot is not None:
            await schedule_compaction(conn, key, changes.snapshot.version)

    async def delete_run(
        self, tenant: str, run_id: str, now: datetime, check: Callable[[Stream], None] | None = None
    ) -> list[StreamKey]:
        return await bounded(self._delete_run(tenant, run_id, now, check))

    async def _delete_run(
        self, tenant: str, run_id: str, now: datetime, check: Callable[[Stream], None] | None
    ) -> list[StreamKey]:
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(_RUN_LOCK, tenant, run_id)
            if not rows:
                raise NotFound(f"no run {run_id!r}")
            forks: dict[StreamKey, set[StreamKey]] = {}
            for source_id, fork_run, fork_id in await conn.fetch(_RUN_FORKS, tenant, run_id):
                source = StreamKey(tenant, run_id, source_id)
                forks.setdefault(source, set()).add(StreamKey(tenant, fork_run, fork_id))
            keys = [StreamKey(tenant, run_id, r[0]) for r in rows]
            kept = kept_by_forks(keys, forks)
            streams, soft = [], []
            for key, r in zip(keys, rows, strict=True):
                stream = Stream(key, decode_definition(r[1]), decode_state(r[2]))
                stream.forked = key in kept
                if check is not None:
                    check(stream)
                if not stream.state.soft_deleted:
                    # A legal hold refuses the whole run: nothing is written.
                    events = stream.delete(now)
                    if key in kept:
                        soft.append((stream, events))
                streams.append(stream)
            for stream, events in soft:  # forks outside the run still read these
                for event in events:
                    stream.apply(event)
                changes = Changes(events=events)
                inline = bool(stream.state.consumers)  # as in update: moved to their column
                await conn.execute(
                    _WRITE, *stream.key, *_write_arguments(stream, changes, [], inline)
                )
                await conn.execute(_SOFT_DELETED, *stream.key)
            erased = [s for s in streams if s.key not in kept]
            await erase(conn, tenant, run_id, [s.key.stream_id for s in erased], "deleted")
            released: list[StreamKey] = []
            for stream in erased:
                released += await _release_sources(
                    conn, stream.key, stream.definition.fork, now, frozenset(keys)
                )
            committing()
        for key in (*keys, *released):
            self.forget(key)
        return keys

    async def list_runs(
        self, tenant: str, after: str | None, limit: int, prefix: str = ""
    ) -> list[RunSummary]:
        rows = await self._pool.fetch(_RUNS, tenant, after or "", limit, prefix)
        return [RunSummary(run_id=r[0], stream_count=r[1], created_at=r[2]) for r in rows]

    async def expired_through(
        self, key: StreamKey, after: int, cutoff: datetime, limit: int
    ) -> int:
        rows = await self._pool.fetch(_EXPIRED, *key, after, limit)
        return expired_prefix(after, [(r[0], r[1]) for r in rows], cutoff)

    async def intent(self, key: StreamKey, object_id: str) -> ObjectIntent | None:
        return await read_intent(self._pool, key, object_id)

    async def forget_receipts(self, older_than: timedelta, batch: int = 1000) -> int:
        return await delete_in_batches(self._pool, _FORGET_RECEIPTS, older_than, batch)

    async def expired_intents(self, now: datetime, limit: int) -> list[tuple[StreamKey, str]]:
        return await read_expired_intents(self._pool, now, limit)

    async def journal(self, key: StreamKey) -> list[Event]:
        return await read_journal(self._pool, key)

    async def page(
        self, key: StreamKey, cursor: int, limit: int
    ) -> tuple[Position, list[StoredRecord]] | None:
        rows = await self._pool.fetch(_PAGE, *key, cursor, limit)
        if not rows:
            return None
        first = rows[0]
        body: Iterable[asyncpg.Record] = islice(rows, 1, None)
        if first[9] is not None:  # UNION ALL promises no order; PostgreSQL keeps it, but if not:
            first = next(r for r in rows if r[9] is None)
            body = sorted((r for r in rows if r[9] is not None), key=lambda r: r[9])
        position = Position(
            head=first[0],
            earliest=first[1],
            closed=first[2],
            created_at=first[3],
            soft_deleted=first[4],
        )
        records = self._records(body) if len(rows) > 1 else []
        if first[5] is None:
            return position, records
        assert position.created_at is not None
        link = ForkLink(StreamKey(key.tenant, first[5], first[6]), first[7], first[8])
        chain = await self._chain(key, position.created_at)
        if not chain or chain[0] != link:  # deleted and created again between the two reads
            self._chains.pop(key, None)
            chain = [link]
        wanted = segments(chain, cursor, limit)
        found: list[tuple[Position | None, list[StoredRecord]]] = [(None, [])] * len(chain)
        by_place: dict[int, list[asyncpg.Record]] = {}
        for r in await self._pool.fetch(
            _SEGMENTS,
            key.tenant,
            [s.key.run_id for s in wanted],
            [s.key.stream_id for s in wanted],
            [s.after for s in wanted],
            [s.through for s in wanted],
            limit,
        ):
            if r[9] is None:  # an ancestor's position (only what `stitched` reads of it)
                found[r[0] - 1] = (
                    Position(head=0, earliest=r[1], closed=False, created_at=r[2]),
                    [],
                )
            else:
                by_place.setdefault(r[0], []).append(r)
        for place, part in by_place.items():
            part.sort(key=lambda r: r[9])
            found[place - 1] = (found[place - 1][0], self._records(part))
        return stitched((position, records), chain, found, limit)

    def _records(self, rows: Iterable[asyncpg.Record]) -> list[StoredRecord]:
        """Records from rows whose columns 9 to 14 are a record's (sequence, raw appended_at,
        kind, content type, size, payload), in ascending sequence."""
        records: list[StoredRecord] = []
        times, kinds, add = self._times, _KINDS, records.append
        previous, ordered = -1, True
        for r in rows:
            at = times.get(raw := r[10])
            if at is None:
                at = _timestamptz(raw)
                if len(times) >= 4096:
                    times.clear()
                times[raw] = at
            if r[9] <= previous:
                ordered = False
            previous = r[9]
            add(StoredRecord(previous, at, kinds[r[11]], r[12], r[13], r[14]))
        if not ordered:  # the lateral's order reaches the outer query in every plan seen
            records.sort(key=lambda record: record.sequence)
        return records

    async def chain(self, key: StreamKey) -> list[ForkLink]:
        created_at = await self.created_at(key)
        return [] if created_at is None else await self._chain(key, created_at)

    async def _chain(self, key: StreamKey, created_at: datetime) -> list[ForkLink]:
        """The fork's chain (`_CHAIN`), once per fork incarnation (its creation time)."""
        known = self._chains.get(key)
        if known is not None and known[0] == created_at:
            return known[1]
        rows = await self._pool.fetch(_CHAIN, *key, _CHAIN_BOUND)
        chain = [ForkLink(StreamKey(key.tenant, r[0], r[1]), r[2], r[3]) for r in rows]
        self._chains[key] = (created_at, chain)
        if len(self._chains) > 10_000:
            del self._chains[next(iter(self._chains))]
        return chain


# A command acting under a worker's claim of the stream's retention job (a prune) is fenced by
# it: the claim must still be this worker's and unexpired, in the same transaction as the
# effect. FOR SHARE holds the job's row until the commit, so a takeover (FOR UPDATE SKIP LOCKED)
# cannot claim it meanwhile. The stream row is locked first, as everywhere.
_RETENTION_FENCE = f"""
    SELECT true FROM retention_jobs
    WHERE {_KEY} AND claimed_by = $4 AND lease_until > clock_timestamp()
    FOR SHARE
"""


async def _check_fences(conn: Connection, key: StreamKey, commands: Sequence[Command]) -> None:
    for command in commands:
        if isinstance(command, PruneCommand) and command.fence_holder is not None:
            held = await conn.fetchval(_RETENTION_FENCE, *key, command.fence_holder)
            command.lease_held = bool(held)


def _with_consumers(state: bytes, consumers: bytes | None) -> StreamState:
    """The snapshot, with its consumers when they were read (None: they were not, or there are
    none yet)."""
    decoded = decode_state(state)
    if consumers is not None:
        decoded.consumers = decode_consumers(consumers)
    return decoded


def _timestamptz(raw: bytes) -> datetime:
    """What asyncpg decodes a timestamptz to, from its binary form (its infinities included:
    the naive extremes)."""
    micros = int.from_bytes(raw, "big", signed=True)
    if micros == 0x7FFF_FFFF_FFFF_FFFF:
        return datetime.max
    if micros == -0x8000_0000_0000_0000:
        return datetime.min
    return _PG_EPOCH + timedelta(microseconds=micros)


async def _link_fork(conn: Connection, key: StreamKey, fork: Fork) -> None:
    """In the fork's creating transaction, after its row is inserted: lock the source row and
    re-check it (the same incarnation, not soft-deleted, far enough), then link the fork to it.
    Raising rolls the whole creation back: a refused fork leaves no reference behind."""
    source = StreamKey(key.tenant, fork.run_id, fork.stream_id)
    payload = await conn.fetchval(_LOCK_SOURCE, *source)
    check_fork_source(source, None if payload is None else decode_state(payload), fork)
    await conn.execute(
        _LINK, *key, fork.run_id, fork.stream_id, fork.source_created_at, fork.through
    )


async def _release_sources(
    conn: Connection,
    key: StreamKey,
    fork: Fork | None,
    now: datetime,
    locked: frozenset[StreamKey] = frozenset(),
) -> list[StreamKey]:
    """The cascade, in the transaction that erased `key` (whose link `erase` removed): up the
    fork chain, lock each source (child before parent) and erase it if it is soft-deleted and
    no fork links to it any more. Sources in `locked` were decided by the caller. Answers the
    sources erased."""
    released = []
    while fork is not None:
        source = StreamKey(key.tenant, fork.run_id, fork.stream_id)
        if source in locked:
            break
        row = await conn.fetchrow(_LOCK_RELEASED, *source)
        if row is None:
            break
        forked = await conn.fetchval(_HAS_FORKS, *source)
        stream = Stream(source, decode_definition(row[0]), decode_state(row[1]), forked=forked)
        if not stream.release(now):
            break
        await erase(conn, source.tenant, source.run_id, [source.stream_id], "deleted")
        released.append(source)
        fork = stream.definition.fork
    return released


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


def _write_arguments(
    stream: Stream, changes: Changes, rows: list[_RecordRow], inline: bool = False
) -> tuple[object, ...]:
    """`inline`: the state was read with its consumers in the snapshot (written before
    migration 0488); they are written to their column now."""
    s = stream.state
    touched = {
        e.consumer_id: None
        for e in changes.events
        if isinstance(e, ConsumerAcknowledged | ConsumerRemoved)
    }
    kept = [(i, s.consumers[i]) for i in touched if i in s.consumers]
    gone = [i for i in touched if i not in s.consumers]
    return (
        [r[3] for r in rows],
        [r[4] for r in rows],
        [r[5] for r in rows],
        [r[6] for r in rows],
        [r[7] for r in rows],
        [r[8] for r in rows],
        [r[9] for r in rows],
        [e.version for e in changes.events],
        [event_type(e) for e in changes.events],
        [encode_event(e) for e in changes.events],
        [r.key for r in changes.receipts],
        [r.fingerprint for r in changes.receipts],
        [r.answer_json for r in changes.receipts],
        [i for i, _ in kept],
        [c.principal for _, c in kept],
        [c.acked_sequence for _, c in kept],
        [c.updated_at for _, c in kept],
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
        [seq for a in changes.appended for seq in a.sequences]
        if stream.definition.direction == "input"
        else [],
        [c.holds_credit for _, c in kept],
        gone,
        bool(touched) or inline,
        encode_consumers(s.consumers) if touched or inline else None,
    )
