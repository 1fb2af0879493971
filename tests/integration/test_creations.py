"""Creations waiting at once are inserted together (adapters/postgres/creations.py), each with
its own answer, on real PostgreSQL."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable

import asyncpg
import msgspec
import pytest

from adapters.postgres.bounded import BoundedPool
from adapters.postgres.creations import LOCK_WAIT_MS, Creation, Creations, insert_together
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
    lock_wait_ms: int = LOCK_WAIT_MS
    rows: list[int] = dataclasses.field(default_factory=list)

    async def __call__(self, rows: str) -> list[asyncpg.Record]:
        self.rows.append(rows.count('"tenant"'))
        return await insert_together(self.pool, rows, self.lock_wait_ms)


async def insert_row(conn: asyncpg.Connection, creation: Creation) -> None:
    """The creation's streams row alone (in the caller's transaction: uncommitted, it holds the
    key against every other insert of it)."""
    await conn.execute(
        "INSERT INTO streams (tenant, run_id, stream_id, definition, created_at, version, "
        "state) VALUES ($1, $2, $3, $4, $5, 1, $6)",
        *(creation.tenant, creation.run_id, creation.stream_id, creation.definition),
        *(creation.created_at, creation.state),
    )


def streams_of(pool: asyncpg.Pool, run: StreamKey) -> Awaitable[list[asyncpg.Record]]:
    return pool.fetch(
        "SELECT stream_id FROM streams WHERE run_id = $1 ORDER BY stream_id", run.run_id
    )


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
    """A statement of several that the server refuses (here a NUL in one row's text) inserts
    nothing: each creation is then inserted alone, and only the bad one fails."""
    repo = PostgresStreams(pool)
    counted = Counted(pool)
    repo._creations = Creations(counted)
    run = new_key()
    good = [run._replace(stream_id=f"g{i}") for i in range(5)]
    bad = run._replace(stream_id="bad\x00")  # (the adapter takes keys as they are given)
    answers = await asyncio.gather(
        *(repo.create(k, definition("s"), NOW) for k in (*good[:2], bad, *good[2:])),
        return_exceptions=True,
    )
    assert [a[1] for a in (*answers[:2], *answers[3:])] == [True] * 5  # type: ignore[index]
    assert isinstance(answers[2], asyncpg.PostgresError)
    assert counted.rows == [6]  # together first, then each alone
    assert [r[0] for r in await streams_of(pool, run)] == [k.stream_id for k in good]


async def test_a_lone_creation_the_server_refuses_fails_at_once_and_no_other(
    database_url: str,
) -> None:
    """A statement of one creation that the server refuses (a standby, read only) answers that
    creation with the error at once; the creations queued meanwhile have their own statement."""
    standby = await asyncpg.create_pool(
        database_url,
        min_size=1,
        max_size=2,
        server_settings={"default_transaction_read_only": "on"},
    )

    async def insert(rows: str) -> list[asyncpg.Record]:
        await asyncio.sleep(0.1)  # in flight while another creation arrives
        return await insert_together(standby, rows)

    creations, run = Creations(insert), new_key()

    async def within(stream_id: str) -> bool | None:
        with waiting.request_budget(2.0):
            return await creations.create(_creation(run._replace(stream_id=stream_id)))

    try:
        lone = asyncio.create_task(within("a"))
        await asyncio.sleep(0.02)
        queued = asyncio.create_task(within("b"))
        answers = await asyncio.wait_for(
            asyncio.gather(lone, queued, return_exceptions=True), timeout=1.0
        )
    finally:
        await standby.close()
    assert all(isinstance(a, asyncpg.ReadOnlySQLTransactionError) for a in answers), answers


async def test_a_key_held_elsewhere_holds_up_no_other_creation(pool: asyncpg.Pool) -> None:
    """A key another transaction holds (being created or erased there): the statement waiting
    for it gives up after `LOCK_WAIT_MS`, and its creations are inserted alone, so that the
    others do not wait for that row."""
    repo, run = PostgresStreams(BoundedPool(pool)), new_key()  # the service's: bounded waits
    held, other = run._replace(stream_id="held"), new_key("t2")._replace(stream_id="unrelated")
    async with pool.acquire() as blocker, blocker.transaction():
        await insert_row(blocker, _creation(held))

        async def within(key: StreamKey, seconds: float) -> bool:
            with waiting.request_budget(seconds):
                return (await repo.create(key, definition(key.stream_id), NOW))[1]

        stuck = asyncio.create_task(within(held, 0.5))
        await asyncio.sleep(0.02)  # its statement waits on the blocker's row
        created = await within(other, 1.0)
        with pytest.raises(Unanswered):  # alone, it waits for its own key
            await stuck
    assert created


async def test_a_key_held_elsewhere_is_created_alone_for_a_while_and_logs_no_error(
    pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a statement waited on another's row, its keys go alone for `ALONE_SECONDS`: one
    tenant creating a held key again and again costs the others' statements nothing more. The
    statement given up on is rolled back by the adapter (the pool would log an error)."""
    monkeypatch.setattr("adapters.postgres.creations.ALONE_SECONDS", 0.3)
    counted = Counted(pool)
    creations = Creations(counted)
    run = new_key()
    held = _creation(run._replace(stream_id="held"))
    async with pool.acquire() as blocker, blocker.transaction():
        await insert_row(blocker, held)
        with caplog.at_level(logging.WARNING):
            assert await creations.create(held) is None  # after the lock wait: alone
            assert counted.rows == [1]
            assert await creations.create(held) is None  # at once, no statement
            assert counted.rows == [1]
        await asyncio.sleep(0.35)
        await blocker.execute("ROLLBACK; BEGIN")
    assert await creations.create(held) is True  # with the others again
    assert counted.rows == [1, 1]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.records


async def test_a_creation_waiting_past_its_bound_is_withdrawn_or_answered_unknown(
    pool: asyncpg.Pool,
) -> None:
    """A creation still queued at its bound creates nothing; one the statement took may have."""
    creations = Creations(Counted(pool, lock_wait_ms=10_000))
    run = new_key()
    first, second = _creation(run._replace(stream_id="a")), _creation(run._replace(stream_id="b"))
    async with pool.acquire() as blocker, blocker.transaction():
        await insert_row(blocker, first)  # the statement inserting it waits for this

        async def within(creation: Creation) -> bool | None:
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
        if await streams_of(pool, run):
            break
        await asyncio.sleep(0.05)
    assert [r[0] for r in await streams_of(pool, run)] == ["a"]  # the withdrawn one never was


async def test_a_statement_inserts_its_rows_in_the_key_order_whatever_order_they_came_in(
    pool: asyncpg.Pool,
) -> None:
    """The order every process inserts in is what keeps two statements with keys in common
    from deadlocking: with the last key held elsewhere, the statement has inserted (and holds)
    every key before it, though that one came first."""
    creations, run = Creations(Counted(pool, lock_wait_ms=10_000)), new_key()
    last, *earlier = (_creation(run._replace(stream_id=n)) for n in ("z", "a", "b", "c"))
    async with pool.acquire() as blocker, blocker.transaction():
        await insert_row(blocker, last)
        made = asyncio.gather(*(creations.create(c) for c in (last, *earlier)))
        await asyncio.sleep(0.3)  # the statement waits for the last key
        async with pool.acquire() as probe:
            for creation in earlier:
                with pytest.raises(asyncpg.LockNotAvailableError):
                    async with probe.transaction():
                        await probe.execute("SET LOCAL lock_timeout = 50")
                        await insert_row(probe, creation)  # waits: the statement holds it
        await blocker.execute("ROLLBACK; BEGIN")
    assert await made == [True] * 4
