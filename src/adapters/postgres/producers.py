"""Idempotent producers in rows of their own (`stream_producers`, migration 0491), apart from
the stream's state snapshot, which every append decodes and writes again: carried there, 1,000
producers cost an append about 4 ms more (bench/producers.py). Under the row lock, a group
loads only the producers its commands name, and writes only the ones its events changed; a
journaled snapshot, once every `snapshot_every` versions, is the one write that takes them all.

The bound (`MAX_PRODUCERS`) is the domain's: a new producer past it makes the stream forget
the least recent. So that the domain finds that one among those loaded, a group that brings a
new producer to a stream near the bound also loads the least recent ones; the others are
counted (`Stream.unloaded_producers`), not loaded."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg
import msgspec

from adapters.postgres.connections import Connection
from application.deciding import Changes
from application.ports import Command
from domain.producers import MAX_PRODUCERS
from domain.state import Producer
from domain.stream import StreamKey

_KEY = "tenant = $1 AND run_id = $2 AND stream_id = $3"
_COLUMNS = "producer_id, epoch, last_seq, updated_at"

_NAMED = f"SELECT {_COLUMNS} FROM stream_producers WHERE {_KEY} AND producer_id = ANY($4::text[])"

_COUNT = f"SELECT count(*) FROM stream_producers WHERE {_KEY}"

# The $4 least recent, and every producer tied with the last of them (the domain breaks a tie by
# producer ID, which the index does not order): an index range of (key, updated_at).
_LEAST_RECENT = f"""
SELECT {_COLUMNS} FROM stream_producers
WHERE {_KEY} AND updated_at <= (
    SELECT updated_at FROM stream_producers WHERE {_KEY}
    ORDER BY updated_at OFFSET $4 - 1 LIMIT 1
)
"""

_ALL = f"SELECT {_COLUMNS} FROM stream_producers WHERE {_KEY}"

# One statement for what a group changed: the producers it accepted claims of, and those it
# forgot. Data-modifying CTEs run to completion; empty arrays change nothing.
_WRITE = f"""
WITH forgotten AS (
    DELETE FROM stream_producers WHERE {_KEY} AND producer_id = ANY($8::text[])
)
INSERT INTO stream_producers (tenant, run_id, stream_id, {_COLUMNS})
SELECT $1, $2, $3, p.id, p.epoch, p.seq, p.at
FROM unnest($4::text[], $5::int8[], $6::int8[], $7::timestamptz[]) AS p(id, epoch, seq, at)
ON CONFLICT (tenant, run_id, stream_id, producer_id) DO UPDATE
SET epoch = excluded.epoch, last_seq = excluded.last_seq, updated_at = excluded.updated_at
"""


def _producers(rows: Sequence[asyncpg.Record]) -> dict[str, Producer]:
    return {r[0]: Producer(epoch=r[1], last_seq=r[2], updated_at=r[3]) for r in rows}


async def all_producers(conn: Connection, key: StreamKey) -> dict[str, Producer]:
    return _producers(await conn.fetch(_ALL, *key))


async def producers_for(
    conn: Connection, key: StreamKey, commands: Sequence[Command]
) -> tuple[dict[str, Producer], int]:
    """Under the row lock: the producers `commands` name, with the least recent ones when a new
    producer could pass the bound, and how many producers that leaves unloaded. One statement
    when every producer named is known (a producer's every append but its first); a new one
    also counts the stream's producers (an index-only count of at most `MAX_PRODUCERS` rows)."""
    # getattr: a command class written before `Command.producer` existed names no producer.
    claims = [getattr(c, "producer", None) for c in commands]
    named = sorted({claim.producer_id for claim in claims if claim is not None})
    if not named:
        return {}, 0  # no claim: no producer is looked at, none is added or forgotten
    loaded = _producers(await conn.fetch(_NAMED, *key, named))
    if all(p in loaded for p in named):
        return loaded, 0  # nothing new: the bound is not looked at
    count = await conn.fetchval(_COUNT, *key)
    if count + len(named) > MAX_PRODUCERS:
        # Each new producer forgets the least recent of those the group did not refresh: with
        # the len(named) least recent at hand, the domain finds every one it forgets.
        for producer_id, producer in _producers(
            await conn.fetch(_LEAST_RECENT, *key, len(named))
        ).items():
            loaded.setdefault(producer_id, producer)
    return loaded, count - len(loaded)


async def write_producers(
    conn: Connection,
    key: StreamKey,
    before: dict[str, Producer],
    after: dict[str, Producer],
    changes: Changes,
) -> None:
    """Write what the group changed (`before`: as loaded, `after`: the state's now). A snapshot
    in `changes` is given every producer (it is what replay starts from), before it is
    journaled."""
    changed = {p: v for p, v in after.items() if before.get(p) != v}
    forgotten = [p for p in before if p not in after]
    snapshot = changes.snapshot
    if snapshot is not None:
        every = await all_producers(conn, key)
        for producer_id in forgotten:
            every.pop(producer_id, None)
        every.update(changed)
        full = msgspec.structs.replace(snapshot.state, producers=every)
        changes.snapshot = msgspec.structs.replace(snapshot, state=full)
        assert changes.events[-1] is snapshot
        changes.events[-1] = changes.snapshot
    if not changed and not forgotten:
        return
    await conn.execute(
        _WRITE,
        *key,
        list(changed),
        [v.epoch for v in changed.values()],
        [v.last_seq for v in changed.values()],
        [v.updated_at for v in changed.values()],
        forgotten,
    )
