"""A commit of a stream this process wrote last takes two round trips to PostgreSQL: `BEGIN`
with the row locked if it still holds the state written (adapters/postgres/stream_writes.py,
`Transaction`), then the write statement with `COMMIT`; so does a batch of streams this process
wrote last (every row locked in the key's order, and counted where it still holds the state
written), and any other batch takes three (its rows are locked and read in one statement).
Whenever a row holds anything else (another process wrote it, it was changed under us,
deleted), the state is read under the lock, and nothing is decided from what this process
remembered."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import asyncpg
import msgspec
import pytest

from adapters.postgres.definitions import DefinitionCache
from adapters.postgres.stream_writes import (
    LOCK_MANY_STATEMENT,
    LOCK_STATEMENT,
    WRITE_STATEMENT,
    prepare_session,
)
from adapters.postgres.streams import PostgresStreams
from application.errors import NotFound
from application.ports import Done, Failed
from domain import errors
from domain.stream import StreamKey
from tests.support.builders import NOW, append, definition, new_key, record


class Queries:
    """Every statement sent on the pool's connections (asyncpg's query loggers)."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def __call__(self, record: object) -> None:
        self.sent.append(getattr(record, "query", ""))


async def counted_pool(url: str, queries: Queries, init: bool) -> asyncpg.Pool:
    async def setup(conn: asyncpg.Connection) -> None:
        conn.add_query_logger(queries)
        if init:
            await prepare_session(conn)

    async def keep(conn: asyncpg.Connection) -> None:
        pass  # as the service's pool: no session state to reset

    return await asyncpg.create_pool(url, min_size=1, max_size=2, init=setup, reset=keep)


@pytest.fixture
async def counted(database_url: str) -> AsyncIterator[tuple[asyncpg.Pool, Queries]]:
    queries = Queries()
    pool = await counted_pool(database_url, queries, init=True)
    yield pool, queries
    await pool.close()


def first_sequences(outcomes: list) -> list[int]:
    assert all(isinstance(o, Done) for o in outcomes), outcomes
    return [o.answer.first_sequence for o in outcomes]


async def test_a_hot_streams_commit_takes_two_round_trips(counted) -> None:
    pool, queries = counted
    repo, key = PostgresStreams(pool), new_key()
    await repo.create(key, definition(), NOW)
    await repo.update(key, [append([record()])])
    for n in range(5):
        queries.sent.clear()
        outcomes = await repo.update(key, [append([record()]), append([record()])])
        assert first_sequences(outcomes) == [2 + 2 * n, 3 + 2 * n]
        assert len(queries.sent) == 2, queries.sent
        assert queries.sent[0].startswith(f"BEGIN; EXECUTE {LOCK_STATEMENT}(")
        assert queries.sent[1].startswith(f"EXECUTE {WRITE_STATEMENT}(")
        assert queries.sent[1].endswith("; COMMIT")


async def streams_written_once(
    pool: asyncpg.Pool, count: int
) -> tuple[PostgresStreams, list[StreamKey]]:
    """An adapter, and `count` streams of one run it created and wrote one batch to."""
    repo, run = PostgresStreams(pool), new_key()
    keys = [run._replace(stream_id=f"s{i}") for i in range(count)]
    for k in keys:
        await repo.create(k, definition(k.stream_id), NOW)
    await repo.update_many([(k, [append([record()])]) for k in keys])
    return repo, keys


async def test_a_batch_of_streams_this_process_wrote_commits_in_two_round_trips(counted) -> None:
    pool, queries = counted
    repo, keys = await streams_written_once(pool, 5)
    run = keys[0]
    queries.sent.clear()
    results = await repo.update_many([(k, [append([record()])]) for k in reversed(keys)])
    assert [first_sequences(r) for r in results] == [[2]] * 5  # type: ignore[arg-type]
    # BEGIN with the rows locked as written, then the write with COMMIT.
    assert len(queries.sent) == 2, queries.sent
    assert queries.sent[0].startswith(f"BEGIN; EXECUTE {LOCK_MANY_STATEMENT}("), queries.sent
    assert queries.sent[1].startswith(f"EXECUTE {WRITE_STATEMENT}(")
    # One stream it never wrote (another process created it): the batch's rows are read, all
    # of them.
    new = run._replace(stream_id="s9")
    await PostgresStreams(pool).create(new, definition(new.stream_id), NOW)
    queries.sent.clear()
    results = await repo.update_many([(k, [append([record()])]) for k in (*keys, new)])
    assert [first_sequences(r) for r in results] == [[3]] * 5 + [[1]]  # type: ignore[arg-type]
    assert len(queries.sent) == 3, queries.sent
    assert queries.sent[0] == "BEGIN", queries.sent


async def test_the_first_commit_of_streams_this_process_created_takes_two_round_trips(
    counted,
) -> None:
    """A creation leaves the definition and the state it wrote known: the first appends, one
    stream's or a batch's, neither read the row nor fetch the definition."""
    pool, queries = counted
    repo, run = PostgresStreams(pool), new_key()
    keys = [run._replace(stream_id=f"n{i}") for i in range(4)]
    await asyncio.gather(*(repo.create(k, definition(k.stream_id), NOW) for k in keys))
    for sent in (
        lambda: repo.update(keys[0], [append([record()])]),
        lambda: repo.update_many([(k, [append([record()])]) for k in keys[1:]]),
    ):
        queries.sent.clear()
        await sent()
        assert len(queries.sent) == 2, queries.sent
        assert queries.sent[0].startswith("BEGIN; EXECUTE "), queries.sent
    for k in keys:
        assert (await repo.page(k, 0, 10))[0].head == 1


async def test_a_stream_another_process_wrote_is_read_again(counted, database_url: str) -> None:
    """Two adapters (two processes) take turns on one stream and on a batch: each finds the row
    moved on from what it wrote and reads it, so sequences stay contiguous."""
    pool, queries = counted
    other_pool = await counted_pool(database_url, Queries(), init=False)
    try:
        ours, theirs = PostgresStreams(pool), PostgresStreams(other_pool)
        key = new_key()
        await ours.create(key, definition(), NOW)
        sequences = []
        for n in range(6):
            repo = (ours, theirs)[n % 2]
            sequences += first_sequences(await repo.update(key, [append([record()] * 2)]))
        assert sequences == [1, 3, 5, 7, 9, 11]
        others = [key._replace(stream_id=f"b{i}") for i in range(3)]
        for k in others:
            await ours.create(k, definition(k.stream_id), NOW)
        batch = [(k, [append([record()])]) for k in others]
        await ours.update_many(batch)
        await theirs.update(others[1], [append([record()])])  # one of them moves on
        queries.sent.clear()
        results = await ours.update_many(batch)
        assert [first_sequences(r) for r in results] == [[2], [3], [2]]  # type: ignore[arg-type]
        # The condition failed (two rows of three held what this one wrote), and the rows were
        # read: the lock, the read, the write.
        assert len(queries.sent) == 3, queries.sent
        assert queries.sent[0].startswith(f"BEGIN; EXECUTE {LOCK_MANY_STATEMENT}(")
        # Alone: a stream the other process wrote since is locked on the condition of the
        # state this one wrote, which fails (3 statements); then, for a while, read with the
        # lock straight away (3), as is the one the batch found moved on. The others keep the
        # condition (2).
        await theirs.update(others[2], [append([record()])])
        lock = f"BEGIN; EXECUTE {LOCK_STATEMENT}("
        for k, first, begun, sent in (
            (others[2], 4, lock, 3),
            (others[2], 5, "BEGIN", 3),
            (others[1], 4, "BEGIN", 3),
            (others[0], 3, lock, 2),
        ):
            queries.sent.clear()
            assert first_sequences(await ours.update(k, [append([record()])])) == [first]
            assert queries.sent[0].startswith(begun), queries.sent
            assert len(queries.sent) == sent, queries.sent
    finally:
        await other_pool.close()


async def test_concurrent_processes_on_one_stream_lose_nothing(counted, database_url) -> None:
    pool, _ = counted
    pools = [await counted_pool(database_url, Queries(), init=bool(i % 2)) for i in range(3)]
    try:
        repos = [PostgresStreams(p) for p in (pool, *pools)]
        key = new_key()
        await repos[0].create(key, definition(), NOW)

        async def writer(repo: PostgresStreams) -> list[int]:
            return [
                s for _ in range(15) for s in first_sequences(await repo.update(key, [append()]))
            ]

        answered = await asyncio.gather(*(writer(r) for r in repos))
        assert sorted(s for a in answered for s in a) == list(range(1, 61))
        assert all(a == sorted(a) for a in answered)
    finally:
        for p in pools:
            await p.close()


async def test_a_row_changed_or_deleted_under_it_is_not_taken_for_the_state_written(
    counted,
) -> None:
    pool, _ = counted
    repo, key = PostgresStreams(pool), new_key()
    await repo.create(key, definition(), NOW)
    await repo.update(key, [append([record()])])
    # Changed under it at the same version (no process of ours writes so; a test can): the
    # row says the stream is closed, and the append is decided from the row, not the memory.
    where = "WHERE tenant = $1 AND run_id = $2 AND stream_id = $3"
    state = json.loads(await pool.fetchval(f"SELECT state FROM streams {where}", *key))
    state["closed"] = True
    await pool.execute(f"UPDATE streams SET state = $4 {where}", *key, json.dumps(state).encode())
    [refused] = await repo.update(key, [append([record()])])
    assert isinstance(refused, Failed) and isinstance(refused.error, errors.StreamClosed)
    # Deleted under it (another process's erasure): 404, not the state it remembers.
    other = key._replace(stream_id="deleted")
    await repo.create(other, definition(other.stream_id), NOW)
    await repo.update(other, [append([record()])])
    await pool.execute(f"DELETE FROM streams {where}", *other)
    with pytest.raises(NotFound):
        await repo.update(other, [append([record()])])


async def test_a_batch_whose_rows_changed_or_went_under_it_decides_from_the_rows(counted) -> None:
    """The batch's condition fails as a whole: each stream is decided from its row as read."""
    pool, _ = counted
    repo, keys = await streams_written_once(pool, 3)
    where = "WHERE tenant = $1 AND run_id = $2 AND stream_id = $3"
    state = json.loads(await pool.fetchval(f"SELECT state FROM streams {where}", *keys[0]))
    state["closed"] = True  # changed at the same version
    await pool.execute(
        f"UPDATE streams SET state = $4 {where}", *keys[0], json.dumps(state).encode()
    )
    await pool.execute(f"DELETE FROM streams {where}", *keys[1])
    closed, gone, kept = await repo.update_many([(k, [append([record()])]) for k in keys])
    assert isinstance(closed, list) and isinstance(closed[0], Failed), closed
    assert isinstance(closed[0].error, errors.StreamClosed)
    assert isinstance(gone, NotFound), gone
    assert first_sequences(kept) == [2]  # type: ignore[arg-type]


async def test_a_connection_without_the_prepared_statements_prepares_them(
    database_url: str,
) -> None:
    queries = Queries()
    pool = await counted_pool(database_url, queries, init=False)
    try:
        repo, key = PostgresStreams(pool), new_key()
        await repo.create(key, definition(), NOW)
        for n in range(3):
            assert first_sequences(await repo.update(key, [append([record()])])) == [n + 1]
        async with pool.acquire() as conn:
            names = await conn.fetch("SELECT name FROM pg_prepared_statements")
        assert {WRITE_STATEMENT, LOCK_STATEMENT, LOCK_MANY_STATEMENT} <= {r["name"] for r in names}
    finally:
        await pool.close()


async def test_the_definitions_kept_are_bounded(counted) -> None:
    """Every request looks its stream's definition up: a long-lived process keeps the most
    recent ones, not one for every stream it ever served, and not more than a bound in bytes
    of them (a definition may hold a schema of up to 64 KiB)."""
    pool, _ = counted
    repo = PostgresStreams(pool)
    repo._definitions = DefinitionCache(most=3)
    keys = [new_key() for _ in range(5)]
    for key in keys:
        await repo.create(key, definition(), NOW)
    for key in keys:
        assert await repo.definition(key) == definition()
    assert [key for key in keys if key in repo._definitions] == keys[-3:]

    heavy = msgspec.structs.replace(definition(), schema={"enum": ["x" * 60_000]})
    repo._definitions = DefinitionCache(most_bytes=150_000)
    fat = [new_key() for _ in range(4)]
    for key in fat:
        await repo.create(key, heavy, NOW)
        assert await repo.definition(key) == heavy
    assert [key for key in fat if key in repo._definitions] == fat[-2:]
    assert repo._definitions.bytes <= 150_000
