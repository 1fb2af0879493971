"""Creations waiting at once are inserted together (adapters/postgres/creations.py), each with
its own answer, on real PostgreSQL."""

from __future__ import annotations

import asyncio
import dataclasses

import asyncpg
import msgspec
import pytest

from adapters.postgres.creations import Creation, Creations
from adapters.postgres.streams import PostgresStreams
from application import waiting
from application.waiting import Unanswered
from domain.definition import Expiry, Retention
from domain.events import encode_event
from domain.stream import Stream, StreamKey, encode_definition, encode_state
from tests.support.builders import NOW, append, definition, new_key


@dataclasses.dataclass
class Counted:
    """The creations' statement, counted (how many ran, and how many rows each carried)."""

    pool: asyncpg.Pool
    rows: list[int] = dataclasses.field(default_factory=list)

    async def __call__(self, statement: str, rows: str) -> list[asyncpg.Record]:
        self.rows.append(rows.count('"tenant"'))
        return await self.pool.fetch(statement, rows)


async def test_creations_at_once_are_inserted_together_each_answering_once(
    pool: asyncpg.Pool,
) -> None:
    repo = PostgresStreams(pool)
    counted = Counted(pool)
    repo._creations = Creations(counted)
    run = new_key()
    existing = run._replace(stream_id="there")
    await repo.create(existing, definition("there", max_unread_items=3), NOW)
    keys = [run._replace(stream_id=f"s{i}") for i in range(40)]
    counted.rows.clear()

    made = await asyncio.gather(
        *(repo.create(key, definition(key.stream_id), NOW) for key in keys),
        *(repo.create(keys[0], definition("s0"), NOW) for _ in range(3)),  # the same key again
        repo.create(existing, definition("there"), NOW),
    )
    fresh, again, (there, there_created) = made[:40], made[40:43], made[43]
    assert all(created for _, created in fresh)
    assert [created for _, created in again] == [False, False, False]
    assert all(stream.key == keys[0] for stream, _ in again)
    # The stream as it is, not the definition asked for.
    assert not there_created and there.definition.limits.max_unread_items == 3
    # One statement for the 40 keys and the existing one; each second creation of s0 in one of
    # its own after the first (a key is in a statement once).
    assert counted.rows == [41, 1, 1, 1], counted.rows
    for key in keys:  # each created whole: its row, its journal's first event, appendable
        assert await pool.fetchval(
            "SELECT count(*) FROM stream_events WHERE tenant = $1 AND run_id = $2 "
            "AND stream_id = $3 AND version = 1 AND type = 'stream_created'",
            *key,
        )
        [outcome] = await repo.update(key, [append()])
        assert outcome.answer.first_sequence == 1  # type: ignore[union-attr]


async def test_a_creation_that_expires_or_retains_is_scheduled_as_alone(
    pool: asyncpg.Pool,
) -> None:
    repo = PostgresStreams(pool)
    run = new_key()
    idle = msgspec.structs.replace(definition("idle"), expiry=Expiry(idle_seconds=60))
    kept = msgspec.structs.replace(definition("kept"), retention=Retention(max_records=10))
    plain = definition("plain")
    keys = [run._replace(stream_id=d.stream_id) for d in (idle, kept, plain)]
    made = await asyncio.gather(
        *(repo.create(k, d, NOW) for k, d in zip(keys, (idle, kept, plain), strict=True))
    )
    assert all(created for _, created in made)
    access = await pool.fetch(
        "SELECT stream_id, idle_seconds, due_at FROM stream_access WHERE run_id = $1", run.run_id
    )
    assert [(r[0], r[1]) for r in access] == [("idle", 60)]
    assert (access[0][2] - NOW).total_seconds() == 60
    jobs = await pool.fetch("SELECT stream_id FROM retention_jobs WHERE run_id = $1", run.run_id)
    assert [r[0] for r in jobs] == ["kept"]


def _creation(key: StreamKey) -> Creation:
    made = definition(key.stream_id)
    stream, event = Stream.create(key, made, NOW)
    return Creation(
        *key,
        encode_definition(made),
        NOW,
        encode_state(stream.state),
        encode_event(event),
        False,
        None,
        None,
    )


async def test_a_creation_the_server_refuses_fails_alone(pool: asyncpg.Pool) -> None:
    counted = Counted(pool)
    creations = Creations(counted)
    run = new_key()
    good = [_creation(run._replace(stream_id=f"g{i}")) for i in range(5)]
    # A NUL in a text column: PostgreSQL refuses the row, so the whole statement.
    bad = msgspec.structs.replace(_creation(run._replace(stream_id="bad")), stream_id="bad\x00")
    answers = await asyncio.gather(
        *(creations.create(c) for c in (*good[:2], bad, *good[2:])), return_exceptions=True
    )
    assert answers[:2] == [True, True] and answers[3:] == [True, True, True]
    assert isinstance(answers[2], asyncpg.PostgresError)
    assert counted.rows[0] == 6  # together first, then each alone
    assert await pool.fetchval("SELECT count(*) FROM streams WHERE run_id = $1", run.run_id) == len(
        good
    )


async def test_a_creation_waiting_past_its_bound_is_withdrawn_or_answered_unknown(
    pool: asyncpg.Pool,
) -> None:
    """A creation still queued at its bound creates nothing; one the statement took may have."""
    creations = Creations(lambda statement, rows: pool.fetch(statement, rows))
    run = new_key()
    first, second = _creation(run._replace(stream_id="a")), _creation(run._replace(stream_id="b"))
    async with pool.acquire() as blocker, blocker.transaction():
        # An uncommitted row of the first key: the statement inserting it waits for this.
        await blocker.execute(
            "INSERT INTO streams (tenant, run_id, stream_id, definition, created_at, version, "
            "state) VALUES ($1, $2, $3, $4, $5, 1, $6)",
            *(first.tenant, first.run_id, first.stream_id, first.definition, NOW, first.state),
        )

        async def within(creation: Creation) -> bool:
            with waiting.request_budget(0.5):
                return await creations.create(creation)

        taken = asyncio.create_task(within(first))
        await asyncio.sleep(0.1)  # its statement waits on the blocker's row
        queued = asyncio.create_task(within(second))
        with pytest.raises(Unanswered) as unknown:
            await taken
        with pytest.raises(Unanswered) as withdrawn:
            await queued
        await blocker.execute("ROLLBACK; BEGIN")
    assert unknown.value.outcome_unknown and not withdrawn.value.outcome_unknown
    for _ in range(100):  # the first statement goes on once the blocker is gone
        if await pool.fetchval("SELECT count(*) FROM streams WHERE run_id = $1", run.run_id):
            break
        await asyncio.sleep(0.05)
    rows = await pool.fetch("SELECT stream_id FROM streams WHERE run_id = $1", run.run_id)
    assert [r[0] for r in rows] == ["a"]  # the withdrawn one was never inserted
