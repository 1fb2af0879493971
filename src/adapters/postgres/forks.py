"""Forks in PostgreSQL: linking a fork to its source, and the cascade that erases a
soft-deleted source once its last fork is gone (docs/architecture.md "Forks, soft delete and
the cascade")."""

from __future__ import annotations

from datetime import datetime

from adapters.postgres.connections import Connection
from adapters.postgres.erasure import erase
from application.fork_reads import check_fork_source
from domain.definition import Fork
from domain.stream import Stream, StreamKey, decode_definition, decode_state

_KEY = "tenant = $1 AND run_id = $2 AND stream_id = $3"

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

# Whether any of these streams (their keys as three arrays) has a fork.
_ANY_FORKED = """
SELECT EXISTS (
    SELECT 1 FROM stream_forks f
    JOIN unnest($1::text[], $2::text[], $3::text[]) AS k (tenant, run_id, stream_id)
      ON f.tenant = k.tenant AND f.source_run_id = k.run_id AND f.source_stream_id = k.stream_id
)
"""

_HAS_FORKS = """
SELECT EXISTS (SELECT 1 FROM stream_forks
               WHERE tenant = $1 AND source_run_id = $2 AND source_stream_id = $3)
"""

_LOCK_RELEASED = f"SELECT definition, state FROM streams WHERE {_KEY} FOR UPDATE"

_RUN_FORKS = """
SELECT source_stream_id, run_id, stream_id FROM stream_forks
WHERE tenant = $1 AND source_run_id = $2
"""


async def fork_facts(conn: Connection, key: StreamKey) -> tuple[bool, int]:
    """Under the stream's row lock: whether forks link to it, and the furthest they pin."""
    row = await conn.fetchrow(_FORK_FACTS, *key)
    assert row is not None  # an aggregate: always one row
    return bool(row[0]), int(row[1])


async def has_forks(conn: Connection, key: StreamKey) -> bool:
    """Under the stream's row lock: whether a fork links to it."""
    return bool(await conn.fetchval(_HAS_FORKS, *key))


async def any_forked(conn: Connection, keys: list[StreamKey]) -> bool:
    """Under these streams' row locks: whether a fork links to any of them (one statement for
    a batch's deletions, which need `fork_facts` only for a stream that has forks)."""
    columns = ([k.tenant for k in keys], [k.run_id for k in keys], [k.stream_id for k in keys])
    return bool(await conn.fetchval(_ANY_FORKED, *columns))


async def run_forks(conn: Connection, tenant: str, run_id: str) -> dict[StreamKey, set[StreamKey]]:
    """The forks of each stream of the run (wherever they are)."""
    forks: dict[StreamKey, set[StreamKey]] = {}
    for source_id, fork_run, fork_id in await conn.fetch(_RUN_FORKS, tenant, run_id):
        source = StreamKey(tenant, run_id, source_id)
        forks.setdefault(source, set()).add(StreamKey(tenant, fork_run, fork_id))
    return forks


async def link_fork(conn: Connection, key: StreamKey, fork: Fork) -> None:
    """In the fork's creating transaction, after its row is inserted: lock the source row and
    re-check it (the same incarnation, not soft-deleted, far enough), then link the fork to it.
    Raising rolls the whole creation back: a refused fork leaves no reference behind."""
    source = StreamKey(key.tenant, fork.run_id, fork.stream_id)
    payload = await conn.fetchval(_LOCK_SOURCE, *source)
    check_fork_source(source, None if payload is None else decode_state(payload), fork)
    await conn.execute(
        _LINK, *key, fork.run_id, fork.stream_id, fork.source_created_at, fork.through
    )


async def release_sources(
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
