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

from adapters.postgres.bounded import bounded
from adapters.postgres.cleanup import aged_rows, delete_in_batches
from adapters.postgres.erasure import WAKE_CHANNEL, erase
from adapters.postgres.intents import project_objects, read_expired_intents, read_intent
from adapters.postgres.journal import read_journal, schedule_compaction
from application.deciding import SNAPSHOT_EVERY, Changes, Receipt, decide_all
from application.errors import NotFound
from application.fork_reads import ForkLink, check_fork_source, kept_by_forks, stitch
from application.ports import Command, Failed, Outcome, Position, RunSummary, StoredRecord
from application.retention import expired_prefix, has_retention
from application.waiting import committing
from application.wake import WakeRegistry
from domain.definition import Fork, StreamDefinition
from domain.events import (
    ConsumerAcknowledged,
    Event,
    RecordsPruned,
    StreamDeleted,
    StreamSoftDeleted,
    encode_event,
    event_type,
)
from domain.objects import ObjectIntent
from domain.records import RecordKind
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
SELECT state, CASE WHEN $4::boolean THEN definition END FROM streams WHERE {_KEY} FOR UPDATE
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
    INSERT INTO stream_consumers
        (tenant, run_id, stream_id, consumer_id, principal, acked_sequence, updated_at)
    SELECT DISTINCT ON (c.id) $1, $2, $3, c.id, c.principal, c.seq, c.at
    FROM unnest($17::text[], $18::text[], $19::int8[], $20::timestamptz[])
         WITH ORDINALITY AS c(id, principal, seq, at, n)
    ORDER BY c.id, c.n DESC
    ON CONFLICT (tenant, run_id, stream_id, consumer_id) DO UPDATE
    SET principal = excluded.principal, acked_sequence = excluded.acked_sequence,
        updated_at = excluded.updated_at
), deliveries AS (
    -- input streams: each record's delivery row commits with the record
    INSERT INTO input_deliveries (tenant, run_id, stream_id, sequence)
    SELECT $1, $2, $3, d FROM unnest($27::bigint[]) AS d
)
UPDATE streams
SET version = $21::bigint, head = $22::bigint, earliest = $23::bigint, closed = $24::boolean,
    legal_hold = $25::boolean, state = $26::bytea
WHERE {_KEY}
RETURNING pg_notify('{WAKE_CHANNEL}', $1 || '/' || $2 || '/' || $3 || ' ' || ($22::bigint)::text)
"""

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
        if wake is not None:  # the wake bus hears deletions on every replica
            wake.on_deleted(self.forget)
            wake.on_missed(self.forget_all)

    def forget(self, key: StreamKey) -> None:
        """The stream was deleted (here or on another replica): drop what is kept of it."""
        self._definitions.pop(key, None)

    def forget_all(self) -> None:
        """Deleted notifications may have been missed (the listen connection dropped)."""
        self._definitions.clear()

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
        row = await self._pool.fetchrow(f"SELECT definition, state FROM streams WHERE {_KEY}", *key)
        if row is None:
            return None
        state = decode_state(row["state"])
        return Stream(key, self._definition(key, state, row["definition"]), state)

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

    async def list_run(self, tenant: str, run_id: str) -> list[Stream]:
        rows = await self._pool.fetch(
            "SELECT stream_id, definition, state FROM streams "
            "WHERE tenant = $1 AND run_id = $2 ORDER BY stream_id",
            tenant,
            run_id,
        )
        streams = []
        for r in rows:
            key, state = StreamKey(tenant, run_id, r["stream_id"]), decode_state(r["state"])
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
        async with self._pool.acquire() as conn, conn.transaction():
            # Never touch the pool while holding the row lock: with every connection waiting
            # on this row, a second acquire by the holder would wait forever.
            row = await conn.fetchrow(_LOCK, *key, key not in self._definitions)
            if row is None:
                raise NotFound(f"no stream {key.stream_id!r} in run {key.run_id!r}")
            state, payload = decode_state(row[0]), row[1]
            known = self._definitions.get(key)
            if payload is None and (known is None or known[0] != state.created_at):
                # Evicted meanwhile, or kept for a deleted stream of the same ID.
                payload = await conn.fetchval(f"SELECT definition FROM streams WHERE {_KEY}", *key)
            stream = Stream(key, self._definition(key, state, payload), state)
            receipts: dict[str, Receipt] = {}
            if keys := [c.idempotency.key for c in commands if c.idempotency is not None]:
                for r in await conn.fetch(_RECEIPTS, *key, keys):
                    receipts[r[0]] = Receipt(r[0], r[1], r[2])
            offsets: dict[int, int] = {}
            if wanted := [c.offset_of for c in commands if c.offset_of is not None]:
                offsets = dict(await conn.fetch(_OFFSETS, *key, wanted))  # type: ignore[arg-type]
            seen = dict(receipts)
            outcomes, changes = decide_all(
                stream, commands, receipts, offsets, self._snapshot_every
            )
            if changes.deleted or any(isinstance(e, RecordsPruned) for e in changes.events):
                forked, pinned_through = await conn.fetchrow(_FORK_FACTS, *key)
                if forked:
                    # Forks still read it: decided again knowing that (a delete is a soft
                    # delete; retention keeps what they inherit), from the state as locked.
                    # Only a delete, an expiry or a prune pays this query.
                    stream = Stream(
                        key,
                        stream.definition,
                        decode_state(row[0]),
                        forked=True,
                        pinned_through=pinned_through,
                    )
                    outcomes, changes = decide_all(
                        stream, commands, seen, offsets, self._snapshot_every
                    )
            released: list[StreamKey] = []
            if changes.deleted:
                # Erased with everything it holds; what the group decided before the delete is
                # erased with it (those requests were answered as if committed just before).
                [deleted] = [e for e in changes.events if isinstance(e, StreamDeleted)]
                await erase(conn, *key[:2], [key.stream_id], deleted.reason)
                released = await _release_sources(conn, key, stream.definition.fork, deleted.at)
            elif changes.events:
                await self._write(conn, key, stream, changes)
            committing()
        if changes.deleted:
            for erased in (key, *released):
                self.forget(erased)
        return outcomes

    @staticmethod
    async def _write(
        conn: asyncpg.Connection, key: StreamKey, stream: Stream, changes: Changes
    ) -> None:
        """Write what a transaction's commands caused, its NOTIFY included."""
        rows = _record_rows(key, changes)
        if len(rows) >= COPY_THRESHOLD:
            # Large groups go by COPY (about twice the rate of unnest for 1,000 rows);
            # small ones ride in the single write statement below.
            await conn.copy_records_to_table(
                "stream_records", records=rows, columns=_RECORD_COLUMNS
            )
            rows = []
        await conn.execute(_WRITE, *key, *_write_arguments(stream, changes, rows))
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
                await conn.execute(_WRITE, *stream.key, *_write_arguments(stream, changes, []))
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
        records: list[StoredRecord] = []
        if len(rows) > 1:
            times, kinds, add = self._times, _KINDS, records.append
            previous, ordered = -1, True
            for r in body:
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
        if first[5] is None:
            return position, records
        link = ForkLink(StreamKey(key.tenant, first[5], first[6]), first[7], first[8])
        return await stitch((position, records), link, cursor, limit, self.page)


def _timestamptz(raw: bytes) -> datetime:
    """What asyncpg decodes a timestamptz to, from its binary form (its infinities included:
    the naive extremes)."""
    micros = int.from_bytes(raw, "big", signed=True)
    if micros == 0x7FFF_FFFF_FFFF_FFFF:
        return datetime.max
    if micros == -0x8000_0000_0000_0000:
        return datetime.min
    return _PG_EPOCH + timedelta(microseconds=micros)


async def _link_fork(conn: asyncpg.Connection, key: StreamKey, fork: Fork) -> None:
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
    conn: asyncpg.Connection,
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
    stream: Stream, changes: Changes, rows: list[_RecordRow]
) -> tuple[object, ...]:
    acks = [e for e in changes.events if isinstance(e, ConsumerAcknowledged)]
    s = stream.state
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
        [a.consumer_id for a in acks],
        [a.principal for a in acks],
        [a.sequence for a in acks],
        [a.at for a in acks],
        s.version,
        s.head,
        s.earliest,
        s.closed,
        s.legal_hold.enabled,
        encode_state(s),
        [seq for a in changes.appended for seq in a.sequences]
        if stream.definition.direction == "input"
        else [],
    )
