"""Stream creations waiting at once, inserted together: one statement and one commit for many.

A workflow platform starts hundreds of runs at once, and each creates its few streams. Each
creation was a statement and a commit (a WAL flush) of its own: 64 connections creating
streams of new runs made 1,151-1,196 a second, 0.42 times the rate of one-record appends spread
over 1,000 streams on the same server (docs/benchmarks.md, "2026-12-06, fourteenth sitting").

A creation with nothing to do in its transaction but insert (no initial records, not a fork:
`PostgresStreams.create` says which) is queued here. One leader per commit group
(`commit_group`, the grouping key of the append path) takes every creation waiting, up to
`MAX_BATCH`, and inserts them with one statement, `_INSERT_MANY`, which answers the keys it
created; what arrives meanwhile waits for the next statement. A lone creation waits for nobody.

- **In the key's order.** The rows are inserted sorted by key, so two processes inserting
  overlapping keys wait for each other in one order and never deadlock.
- **One answer per creation.** A key already there (or inserted meanwhile by another process)
  is not created, and that creation answers so (`create` then loads the stream). A second
  creation of a key already in the batch waits for the next statement, where it finds the first.
- **Never held up by another transaction's row.** The statement waits at most `LOCK_WAIT_MS`
  for a key another transaction holds (being created with initial records, or erased, or in
  another replica's statement); past that, and when the server refuses a statement of several,
  each of its creations is handed back and inserted alone by its own request, as if there were
  no others. A lone creation the server refuses answers its error at once.
- **Bounded.** A creation waits within its request's allowance: still queued at the bound, it
  is withdrawn (503, nothing created); taken into a statement, it answers 503 "may have been
  created". The statement itself runs within the default bound, as the append leader's do.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from datetime import datetime
from typing import Any

import asyncpg
import msgspec

from adapters.postgres.bounded import bounded_on
from adapters.postgres.together import Together
from application.group_commit import commit_group
from application.waiting import committing
from domain.stream import StreamKey

# At most this many creations in one statement, and this many bytes of their definitions and
# states (a definition's schema may take 64 KiB: 256 of those made a statement of 22 MB, and
# the creations behind it waited for it).
MAX_BATCH = 256
MAX_BATCH_BYTES = 1024 * 1024
# A statement that waited on another transaction's row past `LOCK_WAIT_MS`: its keys are each
# created alone for this long, so that a key held elsewhere and created again and again (one
# tenant's loop) does not cost every statement of the others that wait.
ALONE_SECONDS = 1.0
ALONE_KEYS = 10_000  # at most this many such keys remembered, the oldest forgotten first


class Creation(msgspec.Struct, frozen=True):
    """A stream's creation as `_INSERT_MANY` reads it: its rows' columns, bytes as base64."""

    tenant: str
    run_id: str
    stream_id: str
    definition: bytes
    created_at: datetime
    state: bytes
    event: bytes
    retention: bool
    idle_seconds: int | None
    expires_at: datetime | None

    @property
    def key(self) -> StreamKey:
        return StreamKey(self.tenant, self.run_id, self.stream_id)


_encode = msgspec.json.Encoder().encode

# As `_INSERT_STREAM` (adapters/postgres/streams.py) for each row, in the key's order.
_INSERT_MANY = """
WITH wanted AS MATERIALIZED (
    SELECT * FROM json_to_recordset($1::json) AS w(
        tenant text, run_id text, stream_id text, definition text, created_at timestamptz,
        state text, event text, retention boolean, idle_seconds bigint, expires_at timestamptz)
), created AS (
    INSERT INTO streams (tenant, run_id, stream_id, definition, created_at, version, state)
    SELECT tenant, run_id, stream_id, decode(definition, 'base64'), created_at, 1,
           decode(state, 'base64')
    FROM wanted ORDER BY tenant, run_id, stream_id
    ON CONFLICT (tenant, run_id, stream_id) DO NOTHING
    RETURNING tenant, run_id, stream_id
), made AS MATERIALIZED (
    SELECT w.* FROM created c JOIN wanted w USING (tenant, run_id, stream_id)
), scheduled AS (
    INSERT INTO retention_jobs (tenant, run_id, stream_id)
    SELECT tenant, run_id, stream_id FROM made WHERE retention
), accessed AS (
    -- expiry (migration 0482): the creation is the first access
    INSERT INTO stream_access
        (tenant, run_id, stream_id, last_access_at, idle_seconds, expires_at, due_at)
    SELECT tenant, run_id, stream_id, created_at, idle_seconds, expires_at,
           COALESCE(expires_at, created_at + idle_seconds * interval '1 second')
    FROM made WHERE idle_seconds IS NOT NULL OR expires_at IS NOT NULL
    ON CONFLICT (tenant, run_id, stream_id) DO UPDATE
    SET last_access_at = excluded.last_access_at, idle_seconds = excluded.idle_seconds,
        expires_at = excluded.expires_at, due_at = excluded.due_at
), journaled AS (
    INSERT INTO stream_events (tenant, run_id, stream_id, version, type, payload)
    SELECT tenant, run_id, stream_id, 1, 'stream_created', decode(event, 'base64') FROM made
)
SELECT tenant, run_id, stream_id FROM made
"""

# How long a statement of creations waits for another transaction's row (a key being created
# or erased elsewhere) before it gives up; its creations are then inserted one at a time.
LOCK_WAIT_MS = 50


async def insert_together(
    pool: Any, rows: str, lock_wait_ms: int = LOCK_WAIT_MS
) -> list[asyncpg.Record]:
    """`_INSERT_MANY` of `rows` in a transaction whose lock waits give up after
    `lock_wait_ms` (LockNotAvailableError), bounded as the pool's statements are."""

    async def insert() -> list[asyncpg.Record]:
        async with pool.acquire() as conn:
            await conn.execute(f"BEGIN; SET LOCAL lock_timeout = {int(lock_wait_ms)}")
            try:
                created: list[asyncpg.Record] = await conn.fetch(_INSERT_MANY, rows)
            except asyncpg.PostgresError as error:
                if not isinstance(error, asyncpg.PostgresConnectionError) and not conn.is_closed():
                    # Ended here, not by the pool's reset, which logs an error for it (and a
                    # lock wait given up is the designed way out). If the rollback fails too,
                    # the statement's error is still the one answered.
                    with contextlib.suppress(
                        asyncpg.PostgresError, asyncpg.InterfaceError, OSError
                    ):
                        await conn.execute("ROLLBACK")
                raise
            committing()
            await conn.execute("COMMIT")  # (a failed transaction is rolled back on release)
        return created

    return await bounded_on(pool, insert())


class Creations:
    """The creations waiting, inserted together (adapters/postgres/together.py) by `insert`."""

    def __init__(
        self,
        insert: Callable[[str], Awaitable[list[asyncpg.Record]]],
        group_of: Callable[[StreamKey], Hashable] = commit_group,
    ) -> None:
        # `insert(rows)`: `_INSERT_MANY`'s rows inserted (`insert_together`): the keys created.
        self._insert = insert
        self._together: Together[Creation, bool | None] = Together(
            self._insert_all,
            key_of=lambda creation: creation.key,
            group_of=lambda creation: group_of(creation.key),
            name="creations",
            most=MAX_BATCH,
            weigh=lambda creation: len(creation.definition) + len(creation.state),
            most_weight=MAX_BATCH_BYTES,
        )
        # Keys whose statement waited on another's row, until when they are created alone.
        self._alone: dict[StreamKey, float] = {}

    async def create(self, creation: Creation) -> bool | None:
        """Whether `creation` inserted its stream (False: its key was there already), or None:
        the caller is to insert it alone, in its own transaction, as if there were no others.
        That is the answer when the statement waited on another transaction's row past
        `LOCK_WAIT_MS` (a key being created or erased elsewhere: the others are not held up by
        it), and when the server refused a statement of several (one bad row, or an outage:
        each then meets its own error), and for `ALONE_SECONDS` after for the keys of a
        statement that waited so."""
        until = self._alone.get(creation.key)
        if until is not None:
            if time.monotonic() < until:
                return None
            del self._alone[creation.key]
        return await self._together.submit(creation)

    async def _insert_all(self, creations: list[Creation]) -> Sequence[bool | BaseException | None]:
        rows = _encode(creations).decode()
        try:
            created = await self._insert(rows)
        except asyncpg.LockNotAvailableError:
            until = time.monotonic() + ALONE_SECONDS
            for creation in creations:
                self._alone.pop(creation.key, None)
                self._alone[creation.key] = until
                if len(self._alone) > ALONE_KEYS:
                    del self._alone[next(iter(self._alone))]
            return [None] * len(creations)  # each alone: it waits for that row if it is its own
        except asyncpg.PostgresError as error:
            # Refused by the server: nothing of the statement was inserted. Several: each
            # alone, so that one that fails fails only itself.
            return [error] if len(creations) == 1 else [None] * len(creations)
        made = {StreamKey(row[0], row[1], row[2]) for row in created}
        return [creation.key in made for creation in creations]
