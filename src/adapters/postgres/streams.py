"""Streams, their journal, records and receipts in PostgreSQL.

`update` (one stream) and `update_many` (a batch of streams: the group commit across streams)
are the only writers of a stream's state. They take the stream-row lock (`SELECT … FOR
UPDATE`; a batch takes all of its rows in one statement, in the key's order), so every process
and replica that appends, acknowledges or closes the same stream queues on that one row:
sequences, credit and receipts are decided against committed state and nothing else.
Everything the commands caused is written by one statement (adapters/postgres/stream_writes.py),
and the NOTIFY rides in the same transaction, so a listener can never be woken before the
records it will reread are visible. Reads of records are in adapters/postgres/record_reads.py,
the forks' links and cascade in adapters/postgres/forks.py.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import NamedTuple, TypeVar

import asyncpg
import msgspec

from adapters.postgres.bounded import bounded, bounded_on
from adapters.postgres.cleanup import aged_rows, delete_in_batches
from adapters.postgres.connections import Connection
from adapters.postgres.creations import Creation, Creations, insert_together
from adapters.postgres.definitions import DefinitionCache
from adapters.postgres.erasure import WAKE_CHANNEL, erase, erase_keys
from adapters.postgres.forks import (
    any_forked,
    fork_facts,
    has_forks,
    link_fork,
    release_sources,
    run_forks,
)
from adapters.postgres.intents import (
    arm_upload,
    read_expired_intents,
    read_intent,
    upload_ended,
)
from adapters.postgres.journal import read_journal
from adapters.postgres.marks import MARK_WRITTEN
from adapters.postgres.producers import all_producers, producers_for
from adapters.postgres.record_reads import RecordReads
from adapters.postgres.stream_writes import (
    SOFT_DELETED,
    StreamWrites,
    Transaction,
    before_write,
    commit_writes,
    execute_writes,
    has_after_write,
    with_statements,
    write,
)
from adapters.postgres.tenant_counts import (
    COUNT_BYTES,
    RECEIPT_COUNT,
    tenant_bytes,
    tenant_streams,
)
from application import tracing
from application.deciding import SNAPSHOT_EVERY, Changes, Receipt, decide_all
from application.errors import NotFound
from application.fork_reads import ForkLink, kept_by_forks
from application.ports import (
    Command,
    ConsumerPosition,
    Failed,
    Outcome,
    RunPage,
    RunSummary,
)
from application.retention import PruneCommand, expired_prefix, has_retention
from application.waiting import Unanswered, committing
from application.wake import WakeRegistry
from domain.definition import StreamDefinition
from domain.events import (
    Event,
    RecordsPruned,
    StreamDeleted,
    StreamSoftDeleted,
    encode_event,
)
from domain.objects import ObjectIntent
from domain.state import (
    ConsumersNotLoaded,
    Producer,
    decode_consumers,
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

log = logging.getLogger("ductor_streams.group_commit")
K = TypeVar("K")
V = TypeVar("V")

_KEY = "tenant = $1 AND run_id = $2 AND stream_id = $3"
# How often a run's deletion is tried when PostgreSQL ends it as a deadlock.
DEADLOCK_TRIES = 3

_FORK_HEAD = f"""
WITH written AS (
    UPDATE streams SET head = $4, earliest = $5 WHERE {_KEY}
    RETURNING tenant, run_id, stream_id, head
)
{MARK_WRITTEN}
"""
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

# A commit's row locks are FOR NO KEY UPDATE, the lock its UPDATE of the row takes anyway (no
# key column ever changes): exclusive among commits, and never waiting for (nor kept waiting by)
# a FOR KEY SHARE, which the default wait service's insert and foreign keys' checks take. A
# deletion takes FOR UPDATE first (adapters/postgres/erasure.py).
_LOCK = f"""
SELECT state, CASE WHEN $4::boolean THEN definition END,
       CASE WHEN $5::boolean THEN COALESCE(consumers, '{{}}'::bytea) END
FROM streams WHERE {_KEY} FOR NO KEY UPDATE
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
# batch ended, so held receipts are passed over once per sweep (delete_in_batches). What they
# counted is taken from their tenants' bytes in the same statement.
_COUNTED_AS = f", tenant, {RECEIPT_COUNT} AS size"
_FORGET_RECEIPTS = f"""
WITH forgotten AS (
    {aged_rows("append_receipts", "ctid", "created_at", returning=_COUNTED_AS)}
), uncounted AS (
    {COUNT_BYTES.format(sign="-", records="SELECT tenant, size FROM forgotten")}
)
SELECT created_at FROM forgotten
"""

_OFFSETS = f"""
SELECT sequence, end_offset FROM stream_records WHERE {_KEY} AND sequence = ANY($4::bigint[])
"""


# A batch's row locks, in one statement and one fixed order (the key's), whichever process or
# replica takes them: two batches that overlap wait for each other, never in a cycle. The
# lock is taken row by row as the sorted rows pass (LockRows above the sort).
_LOCK_MANY = """
SELECT s.tenant, s.run_id, s.stream_id, s.state, CASE WHEN k.definition THEN s.definition END,
       CASE WHEN k.consumers THEN COALESCE(s.consumers, '{}'::bytea) END
FROM json_to_recordset($1::json)
     AS k(tenant text, run_id text, stream_id text, definition boolean, consumers boolean)
JOIN streams s ON s.tenant = k.tenant AND s.run_id = k.run_id AND s.stream_id = k.stream_id
ORDER BY s.tenant, s.run_id, s.stream_id
FOR NO KEY UPDATE OF s
"""


class _Wanted(msgspec.Struct, frozen=True):
    """A row `_LOCK_MANY` locks, and whether its definition and its consumers are read (its
    rows go as one JSON parameter: arrays made asyncpg check each element of each, 2-3 µs a
    stream of a batch)."""

    tenant: str
    run_id: str
    stream_id: str
    definition: bool
    consumers: bool


_encode_wanted = msgspec.json.Encoder().encode

_RECEIPTS_MANY = """
SELECT x.tenant, x.run_id, x.stream_id, r.idempotency_key, r.fingerprint, r.answer
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS x(tenant, run_id, stream_id, k)
JOIN append_receipts r ON r.tenant = x.tenant AND r.run_id = x.run_id
                      AND r.stream_id = x.stream_id AND r.idempotency_key = x.k
"""

_EXPIRED = f"""
SELECT sequence, appended_at FROM stream_records
WHERE {_KEY} AND sequence > $4 ORDER BY sequence LIMIT $5
"""

# A keyset page over the primary key (tenant, run_id, stream_id): an index range scan that stops
# after `limit` rows (LIMIT NULL is no limit), whatever the size of the run.
_RUN_STREAMS = """
SELECT stream_id, definition, state, consumers FROM streams
WHERE tenant = $1 AND run_id = $2 AND stream_id > $3 ORDER BY stream_id LIMIT $4
"""

# `_RUN_STREAMS` within $5 bytes of stored definitions, states and consumers (the first row
# whatever its size), with how many rows the page had before that cut. octet_length reads a
# TOASTed value's size from its header.
_RUN_STREAMS_WITHIN = """
SELECT stream_id, definition, state, consumers, upto, fetched FROM (
    SELECT *, sum(octet_length(definition) + octet_length(state)
                  + coalesce(octet_length(consumers), 0)) OVER w AS upto,
           row_number() OVER w AS n, count(*) OVER () AS fetched
    FROM (
        SELECT stream_id, definition, state, consumers FROM streams
        WHERE tenant = $1 AND run_id = $2 AND stream_id > $3 ORDER BY stream_id LIMIT $4
    ) page
    WINDOW w AS (ORDER BY stream_id)
) r WHERE upto <= $5 OR n = 1
ORDER BY stream_id
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


class PostgresStreams(RecordReads):
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
        self._definitions = DefinitionCache()
        self._times: dict[bytes, datetime] = {}  # page(): appended_at by its timestamptz_send
        # Forks' chains (`_CHAIN`), with the creation time of the fork they belong to.
        self._chains: dict[StreamKey, tuple[datetime, list[ForkLink]]] = {}
        # The state each recently written stream's row holds (`_remember`), oldest first: its
        # next transaction locks the row with its BEGIN if the row's state still hashes as
        # this (`Transaction`), instead of reading the state back: one round trip less.
        self._known: dict[StreamKey, bytes] = {}
        # Streams whose known state another process's write made stale (when, oldest first):
        # not remembered for `CONTENDED_SECONDS`, so that two processes taking turns on a
        # stream do not each pay a lock that finds the other's state.
        self._contended: dict[StreamKey, float] = {}
        # Creations that only insert, waiting at once: inserted together.
        self._creations = Creations(lambda rows: insert_together(self._pool, rows))
        if wake is not None:  # the wake bus hears deletions on every replica
            wake.on_deleted(self.forget)
            wake.on_missed(self.forget_all)

    def forget(self, key: StreamKey) -> None:
        """The stream was deleted (here or on another replica): drop what is kept of it."""
        self._definitions.drop(key)
        self._chains.pop(key, None)
        self._known.pop(key, None)
        self._contended.pop(key, None)

    def forget_all(self) -> None:
        """Deleted notifications may have been missed (the listen connection dropped)."""
        self._definitions.clear()
        self._chains.clear()
        self._known.clear()
        self._contended.clear()

    def _remember(self, writes: StreamWrites) -> None:
        """After their commit: the states the write left in its streams' rows, the most recent
        `KNOWN_STATES` of them kept (`_known`)."""
        now = time.monotonic()
        for row in writes.streams:
            key = StreamKey(row.tenant, row.run_id, row.stream_id)
            missed = self._contended.get(key)
            if missed is not None and now - missed < CONTENDED_SECONDS:
                self._known.pop(key, None)
                continue
            if missed is not None:
                del self._contended[key]
            _keep_recent(self._known, key, row.state)

    async def create(
        self,
        key: StreamKey,
        definition: StreamDefinition,
        now: datetime,
        then: Sequence[Command] = (),
    ) -> tuple[Stream, bool]:
        stream, event = Stream.create(key, definition, now)
        creation = Creation(
            *key,
            encode_definition(definition),
            now,
            encode_state(stream.state),
            encode_event(event),
            has_retention(definition),
            definition.expiry.idle_seconds,
            definition.expiry.expires_at,
        )
        created: bool | None
        if then or definition.fork is not None:
            created = await bounded(self._create_then(stream, creation, then))
        else:  # with the other creations waiting (adapters/postgres/creations.py)
            created = await self._creations.create(creation)
            if created is None:  # not with the others: alone, as if there were none
                created = await self._pool.fetchval(
                    _INSERT_STREAM, *msgspec.structs.astuple(creation)
                )
            if created:
                # Its first append needs neither read: the definition is the one just
                # written, and the row holds the state this process wrote (`_remember`).
                self._definitions.keep(key, now, definition, len(creation.definition))
                _keep_recent(self._known, key, creation.state)
        if created:
            return stream, True
        existing = await self.load(key)
        if existing is None:  # deleted meanwhile: the ID is free again
            return await self.create(key, definition, now, then)
        return existing, False

    async def _create_then(
        self, stream: Stream, creation: Creation, then: Sequence[Command]
    ) -> bool:
        """Insert the stream row and write what `then` causes in the same transaction. Until it
        commits nobody else sees the row (a concurrent create of the key waits on the insert),
        so the commands are decided without a `FOR UPDATE`; the write's NOTIFY wakes readers
        at the commit, as after `update`. A failing command rolls the creation back."""
        with tracing.span("postgresql transaction", kind="client", attributes=_DB):
            return await self._create_then_in(stream, creation, then)

    async def _create_then_in(
        self, stream: Stream, creation: Creation, then: Sequence[Command]
    ) -> bool:
        async with self._pool.acquire() as conn, conn.transaction():
            if not await conn.fetchval(_INSERT_STREAM, *msgspec.structs.astuple(creation)):
                return False
            fork = stream.definition.fork
            if fork is not None:  # the source locked after the fork's row: child before parent
                await link_fork(conn, stream.key, fork)
                # The row's head and earliest columns (what pages read) start where the fork's
                # state does, at its fork point, not at the columns' defaults (0 and 1); the
                # links a pattern gave it are marked pending if it starts with records.
                await conn.execute(
                    _FORK_HEAD, *stream.key, stream.state.head, stream.state.earliest
                )
                if not then and stream.state.head > 0:
                    # It starts with records (its source's): announced like an append's, at the
                    # commit, so that a subscription whose pattern links it wakes now (the
                    # scheduler hears of work from announcements, and of the rest every 5 s).
                    key = stream.key
                    await conn.execute(
                        "SELECT pg_notify($1, $2)",
                        WAKE_CHANNEL,
                        f"{key.tenant}/{key.run_id}/{key.stream_id} {stream.state.head}",
                    )
            if not then:
                return True
            outcomes, changes = decide_all(stream, then, {}, {}, self._snapshot_every)
            for outcome in outcomes:
                if isinstance(outcome, Failed):
                    raise outcome.error
            assert not changes.deleted
            await write(conn, stream.key, stream, changes)
            committing()
        return True

    async def load(self, key: StreamKey) -> Stream | None:
        """The whole stream, its producers and consumers included (the producers from their
        own rows, in the same snapshot: repeatable read makes the two statements one)."""
        return await bounded_on(self._pool, self._load(key))

    async def _load(self, key: StreamKey) -> Stream | None:
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
        """Definitions are immutable, so decoded ones are kept (`DefinitionCache`), each with
        its stream's creation time: `state` says which stream this is."""
        known = self._definitions.get(key)
        if known is not None and known[0] == state.created_at:
            return known[1]
        assert payload is not None and state.created_at is not None
        definition = decode_definition(payload)
        self._definitions.keep(key, state.created_at, definition, len(payload))
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

    async def list_run_within(
        self, tenant: str, run_id: str, after: str | None, limit: int, max_bytes: int
    ) -> RunPage:
        rows = await self._pool.fetch(
            _RUN_STREAMS_WITHIN, tenant, run_id, after or "", limit, max_bytes
        )
        streams = []
        for r in rows:
            key = StreamKey(tenant, run_id, r["stream_id"])
            state = _with_consumers(r["state"], r["consumers"])
            streams.append(Stream(key, self._definition(key, state, r["definition"]), state))
        if not rows:
            return RunPage([], 0, False)
        return RunPage(streams, int(rows[-1]["upto"]), len(rows) < rows[-1]["fetched"])

    async def definition(self, key: StreamKey) -> StreamDefinition | None:
        if (known := self._definitions.get(key)) is not None:
            return known[1]
        row = await self._pool.fetchrow(
            f"SELECT definition, created_at FROM streams WHERE {_KEY}", *key
        )
        if row is None:
            return None
        definition = decode_definition(row[0])
        self._definitions.keep(key, row[1], definition, len(row[0]))
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
        async with self._pool.acquire() as conn:
            settled = await with_statements(conn, lambda: self._update_on(conn, key, commands))
        self._forget_erased(settled)
        return settled.outcomes

    async def _update_on(
        self, conn: Connection, key: StreamKey, commands: Sequence[Command]
    ) -> _Settled:
        needs_consumers = any(getattr(c, "needs_consumers", False) for c in commands)
        known = self._known.get(key) if not needs_consumers else None
        async with Transaction(conn, key, known) as transaction:
            if known is not None and not transaction.locked:
                # Another process wrote it (or it changed under us): for a while, its state is
                # read with the lock straight away, not checked against what this one wrote.
                self._known.pop(key, None)
                _keep_recent(self._contended, key, time.monotonic())
            # Never touch the pool while holding the row lock: with every connection waiting
            # on this row, a second acquire by the holder would wait forever.
            if transaction.locked:
                assert known is not None
                row: tuple[bytes, bytes | None, bytes | None] = (known, None, None)
            else:
                locked = await conn.fetchrow(
                    _LOCK, *key, key not in self._definitions, needs_consumers
                )
                if locked is None:
                    raise NotFound(f"no stream {key.stream_id!r} in run {key.run_id!r}")
                row = (locked[0], locked[1], locked[2])
            settled = await self._settle(conn, key, row, commands, None)
            writes = StreamWrites()
            after: list[tuple[StreamKey, Changes]] = []
            if not settled.changes.deleted and settled.changes.events:
                await before_write(
                    conn,
                    writes,
                    key,
                    settled.stream,
                    settled.changes,
                    settled.producers,
                    settled.inline,
                )
                if has_after_write(settled.changes):
                    after.append((key, settled.changes))
            await commit_writes(conn, transaction, writes, after)
        self._remember(writes)
        return settled

    async def update_many(
        self, groups: Sequence[tuple[StreamKey, Sequence[Command]]]
    ) -> list[list[Outcome] | Exception]:
        if len(groups) == 1:  # the hot stream's path: one row, no batch statements
            key, commands = groups[0]
            try:
                return [await self.update(key, commands)]
            except NotFound as error:
                return [error]
        try:
            return await bounded(self._update_many(groups))
        except (OSError, asyncpg.InterfaceError):
            raise  # a silent or lost connection, or a commit of unknown outcome: the batch's
        except Exception as error:
            log.warning(
                "a batch of %d streams was refused (%s: %s); committing each stream alone",
                len(groups),
                type(error).__name__,
                error,
            )
            # The server refused the batch (a deadlock with a cascade that locks out of the
            # key's order, a stream whose write fails): nothing of it was committed. Each
            # stream is then committed on its own, so that one stream fails only itself.
            results: list[list[Outcome] | Exception] = []
            for key, commands in groups:
                try:
                    results.append(await self.update(key, commands))
                except (OSError, asyncpg.InterfaceError):
                    raise
                except Exception as error:
                    results.append(error)
            return results

    async def _update_many(
        self, groups: Sequence[tuple[StreamKey, Sequence[Command]]]
    ) -> list[list[Outcome] | Exception]:
        """One transaction for many streams: every row locked by one statement in the key's
        order, each stream decided as `_update` decides it, the writes of all in one statement
        (`_WRITE`), one COMMIT, one WAL flush; each NOTIFY is delivered at that commit."""
        with tracing.span(
            "postgresql transaction",
            kind="client",
            attributes={**_DB, "ductor_streams.streams": len(groups)},
        ):
            return await self._update_many_in(groups)

    async def _update_many_in(
        self, groups: Sequence[tuple[StreamKey, Sequence[Command]]]
    ) -> list[list[Outcome] | Exception]:
        async with self._pool.acquire() as conn:
            results, done = await with_statements(conn, lambda: self._update_many_on(conn, groups))
        for settled in done:
            self._forget_erased(settled)
        return results

    async def _update_many_on(
        self, conn: Connection, groups: Sequence[tuple[StreamKey, Sequence[Command]]]
    ) -> tuple[list[list[Outcome] | Exception], list[_Settled]]:
        to_lock = [
            _Wanted(
                *key,
                key not in self._definitions,
                any(getattr(c, "needs_consumers", False) for c in commands),
            )
            for key, commands in groups
        ]
        # When this process wrote every one of them last (and knows their definitions), the
        # rows are locked with the BEGIN on the condition of those states, as a hot stream's is
        # (`_update_on`): one round trip less. Else, or if one changed, they are read.
        states = [(key, self._known.get(key)) for key, _ in groups]
        known = [
            (key, state)
            for (key, state), w in zip(states, to_lock, strict=True)
            if state is not None and not (w.definition or w.consumers)
        ]
        if len(known) < len(groups):
            known = []
        async with Transaction(conn, known=known) as transaction:
            locked: dict[StreamKey, tuple[bytes, bytes | None, bytes | None]]
            if known and transaction.locked:
                locked = {key: (state, None, None) for key, state in known}
            else:
                rows = await conn.fetch(_LOCK_MANY, _encode_wanted(to_lock).decode())
                locked = {StreamKey(r[0], r[1], r[2]): (r[3], r[4], r[5]) for r in rows}
                if known:
                    now = time.monotonic()
                    for key, state in known:
                        row = locked.get(key)
                        if row is None or row[0] != state:  # another process wrote it
                            self._known.pop(key, None)
                            _keep_recent(self._contended, key, now)
            receipts: dict[StreamKey, dict[str, Receipt]] = {}
            wanted = [
                (key, c.idempotency.key)
                for key, commands in groups
                if key in locked
                for c in commands
                if c.idempotency is not None
            ]
            if wanted:
                for r in await conn.fetch(
                    _RECEIPTS_MANY,
                    [k.tenant for k, _ in wanted],
                    [k.run_id for k, _ in wanted],
                    [k.stream_id for k, _ in wanted],
                    [i for _, i in wanted],
                ):
                    receipts.setdefault(StreamKey(r[0], r[1], r[2]), {})[r[3]] = Receipt(
                        r[3], r[4], r[5]
                    )
            # A batch's deletions: when no stream they may erase has a fork (the usual case),
            # each is decided knowing that, and they are erased together once every stream is
            # decided, in two statements, where each took three round trips in turn.
            erasing = {
                key
                for key, commands in groups
                if key in locked and any(getattr(c, "erases", False) for c in commands)
            }
            if len(erasing) < 2 or await any_forked(conn, sorted(erasing)):
                erasing = set()
            results: list[list[Outcome] | Exception] = []
            done: list[_Settled] = []
            for key, commands in groups:
                row = locked.get(key)
                if row is None:
                    results.append(NotFound(f"no stream {key.stream_id!r} in run {key.run_id!r}"))
                    continue
                try:
                    settled = await self._settle(
                        conn, key, row, commands, receipts.get(key, {}), unforked=key in erasing
                    )
                except NotFound as gone:
                    results.append(gone)
                    continue
                results.append(settled.outcomes)
                done.append(settled)
            if erasing:
                await self._erase_together(conn, done, erasing)
            else:
                await _release_soft_deleted(conn, done)
            writing = [d for d in done if not d.changes.deleted and d.changes.events]
            writes = StreamWrites()
            for d in writing:
                await before_write(conn, writes, d.key, d.stream, d.changes, d.producers, d.inline)
            after = [(d.key, d.changes) for d in writing if has_after_write(d.changes)]
            await commit_writes(conn, transaction, writes, after)
        self._remember(writes)
        return results, done

    async def _erase_together(
        self, conn: Connection, done: list[_Settled], erasing: set[StreamKey]
    ) -> None:
        """Erase the batch's streams in `erasing` that their commands deleted (`_settle` left
        them to this), then walk up the fork chain of each that was a fork, in the batch's
        order, as `_settle` does after erasing one."""
        deleted = [
            (i, settled, event)
            for i, settled in enumerate(done)
            if settled.key in erasing and settled.changes.deleted
            for event in settled.changes.events
            if isinstance(event, StreamDeleted)
        ]
        for reason in sorted({event.reason for _, _, event in deleted}):
            await erase_keys(conn, [s.key for _, s, e in deleted if e.reason == reason], reason)
        for i, settled, event in deleted:
            fork = settled.stream.definition.fork
            if fork is not None:
                released = await release_sources(conn, settled.key, fork, event.at)
                done[i] = settled._replace(released=released)

    async def _settle(
        self,
        conn: Connection,
        key: StreamKey,
        row: tuple[bytes, bytes | None, bytes | None],
        commands: Sequence[Command],
        receipts_read: dict[str, Receipt] | None,
        *,
        unforked: bool = False,
    ) -> _Settled:
        """Decide the stream's commands under its row lock (`row`: its state, its definition
        when asked for, its consumers when asked for), and erase it if one deleted it. What
        else they caused is written by the caller. `receipts_read`: the receipts of their
        idempotency keys when already read. `unforked`: the caller found that no fork links to
        it, and erases it, if deleted, with the batch's others (`_erase_together`)."""
        state, payload = decode_state(row[0]), row[1]
        known = self._definitions.get(key)
        if payload is None and (known is None or known[0] != state.created_at):
            # Evicted meanwhile, or kept for a deleted stream of the same ID.
            payload = await conn.fetchval(f"SELECT definition FROM streams WHERE {_KEY}", *key)
            if payload is None:
                # Erased since its row was locked, by this transaction: the cascade of a fork
                # decided before it in the batch released it. It is gone, as if deleted before.
                raise NotFound(f"no stream {key.stream_id!r} in run {key.run_id!r}")
        definition = self._definition(key, state, payload)
        # A snapshot written before migration 0488 still carries its consumers: this
        # write moves them to their column.
        inline = bool(state.consumers)
        # Only the producers this group names (and, near the bound, the least recent).
        producers, unloaded = await producers_for(conn, key, commands)
        receipts: dict[str, Receipt] = {}
        if receipts_read is not None:
            receipts = receipts_read
        elif keys := [c.idempotency.key for c in commands if c.idempotency is not None]:
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
        unused: StreamState | None = state

        async def decide() -> tuple[Stream, list[Outcome], Changes]:
            # From the state as locked, each time: a decision that needs the consumers
            # raises before anything is written, and is decided again with them.
            nonlocal consumers, unused
            for _ in range(2):
                if unused is not None and consumers is None:
                    locked, unused = unused, None  # the state decoded above, not decoded again
                else:
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
        # No fork links to an `unforked` stream, and none can while its row is locked.
        if not unforked and (
            changes.deleted or any(isinstance(e, RecordsPruned) for e in changes.events)
        ):
            forked, pinned_through = await fork_facts(conn, key)
            if forked:
                # Forks still read it: decided again knowing that (a delete is a soft
                # delete; retention keeps what they inherit), from the state as locked.
                # Only a delete, an expiry or a prune pays this query.
                stream, outcomes, changes = await decide()
        released: list[StreamKey] = []
        if changes.deleted and not unforked:
            # Erased with everything it holds; what the group decided before the delete is
            # erased with it (those requests were answered as if committed just before).
            [deleted] = [e for e in changes.events if isinstance(e, StreamDeleted)]
            await erase(conn, *key[:2], [key.stream_id], deleted.reason)
            released = await release_sources(conn, key, stream.definition.fork, deleted.at)
        return _Settled(key, stream, outcomes, changes, producers, inline, released)

    def _forget_erased(self, settled: _Settled) -> None:
        if settled.changes.deleted:
            for erased in (settled.key, *settled.released):
                self.forget(erased)

    async def delete_run(
        self, tenant: str, run_id: str, now: datetime, check: Callable[[Stream], None] | None = None
    ) -> list[StreamKey]:
        # A deadlock (PostgreSQL rolled the deletion back: nothing of it happened) is tried
        # again; the request's budget bounds the tries.
        for attempt in range(1, DEADLOCK_TRIES + 1):
            try:
                return await bounded(self._delete_run(tenant, run_id, now, check))
            except asyncpg.DeadlockDetectedError:
                if attempt == DEADLOCK_TRIES:
                    raise Unanswered("the database (a deadlock, tried again)", 0.0) from None
                await asyncio.sleep(random.uniform(0.01, 0.1))
        raise AssertionError("unreachable")

    async def _delete_run(
        self, tenant: str, run_id: str, now: datetime, check: Callable[[Stream], None] | None
    ) -> list[StreamKey]:
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(_RUN_LOCK, tenant, run_id)
            if not rows:
                raise NotFound(f"no run {run_id!r}")
            forks = await run_forks(conn, tenant, run_id)
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
                writes = StreamWrites()
                writes.add(stream, changes, [], inline)
                await execute_writes(conn, writes)
                await conn.execute(SOFT_DELETED, *stream.key)
            erased = [s for s in streams if s.key not in kept]
            # (`_RUN_LOCK` took the rows FOR UPDATE, waiting for any FOR KEY SHARE: that is
            # what `lock_for_deletion` would do.)
            ids = [s.key.stream_id for s in erased]
            await erase(conn, tenant, run_id, ids, "deleted", locked_for_update=True)
            released: list[StreamKey] = []
            # (Once: built for each erased stream, it cost a run of 10,000 streams 7 s of this
            # process's CPU, and 20,000 46 s, every other request of the process waiting.)
            # Those erased here need no look: the run's soft-deleted ones do, for a chain of
            # forks may leave the run and come back (s in it <- f in another <- g in it), and
            # g's erasure then releases f and, through it, s.
            gone = frozenset(s.key for s in erased)
            for stream in erased:
                released += await release_sources(
                    conn, stream.key, stream.definition.fork, now, gone
                )
            committing()
        for key in (*keys, *released):
            self.forget(key)
        return keys

    async def tenant_streams(self, tenant: str) -> int:
        return await tenant_streams(self._pool, tenant)

    async def tenant_bytes(self, tenant: str) -> int:
        return await tenant_bytes(self._pool, tenant)

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

    async def uploading(
        self, key: StreamKey, storage_region: str, storage_key: str, due: datetime
    ) -> None:
        await arm_upload(self._pool, key, storage_region, storage_key, due)

    async def upload_ended(self, key: StreamKey, storage_region: str, storage_key: str) -> None:
        await upload_ended(self._pool, key, storage_region, storage_key)

    async def journal(self, key: StreamKey) -> list[Event]:
        return await read_journal(self._pool, key)


# How many streams' states `_known` keeps: a few MB at most (a state without its producers and
# consumers is a few hundred bytes), more streams than one process appends to at once.
KNOWN_STATES = 10_000


def _keep_recent(kept: dict[K, V], key: K, value: V, most: int = KNOWN_STATES) -> None:
    """`kept[key] = value` as its most recent entry, the oldest dropped past `most`."""
    kept.pop(key, None)
    kept[key] = value
    if len(kept) > most:
        del kept[next(iter(kept))]


CONTENDED_SECONDS = 1.0

# The attributes of a transaction's span (OpenTelemetry's database conventions).
_DB = {"db.system.name": "postgresql", "db.operation.name": "transaction"}

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


async def _release_soft_deleted(conn: Connection, done: list[_Settled]) -> None:
    """A stream of the batch soft-deleted (a fork still read it when it was decided) whose last
    fork the batch erased after that: erased now, as the fork's cascade would have (it read
    the stream's row before its soft delete was written), with its own chain after it. Else it
    stayed soft-deleted with no fork, for ever. Again until nothing more goes: a chain of them
    soft-deleted in the batch (P <- S <- F, decided in that order) goes one link a pass."""
    changed = any(d.changes.deleted for d in done)
    while changed:
        changed = False
        for i, settled in enumerate(done):
            if settled.changes.deleted:
                continue
            soft = [e for e in settled.changes.events if isinstance(e, StreamSoftDeleted)]
            if not soft or await has_forks(conn, settled.key):
                continue
            stream = settled.stream
            stream.forked = False
            events = stream.release(soft[0].at)
            if not events:
                continue
            key = settled.key
            await erase(conn, key.tenant, key.run_id, [key.stream_id], soft[0].reason)
            chain = await release_sources(conn, key, stream.definition.fork, soft[0].at)
            changes = Changes(events=[*settled.changes.events, *events], deleted=True)
            done[i] = settled._replace(changes=changes, released=[*settled.released, *chain])
            changed = True


def _with_consumers(state: bytes, consumers: bytes | None) -> StreamState:
    """The snapshot, with its consumers when they were read (None: they were not, or there are
    none yet)."""
    decoded = decode_state(state)
    if consumers is not None:
        decoded.consumers = decode_consumers(consumers)
    return decoded


class _Settled(NamedTuple):
    """A stream's commands decided under its lock (and the stream erased, if one deleted it)."""

    key: StreamKey
    stream: Stream
    outcomes: list[Outcome]
    changes: Changes
    producers: dict[str, Producer]
    inline: bool
    released: list[StreamKey]
