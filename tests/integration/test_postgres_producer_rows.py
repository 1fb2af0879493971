"""Idempotent producers in rows of their own (migration 0491): what an append reads and writes of
them does not grow with their number, and a database whose snapshots still carry them is moved
over without losing one."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest

from adapters.postgres.migrations import migrate
from adapters.postgres.streams import PostgresStreams
from application.append_records import ProduceCommand
from application.ports import Failed
from domain import errors
from domain.producers import ProducerClaim
from domain.state import Producer, StreamState, encode_state
from domain.stream import Stream, StreamKey, encode_definition
from tests.support.builders import NOW, WRITER, definition, new_key, record
from tests.support.postgres import database_before

KEY = "tenant = $1 AND run_id = $2 AND stream_id = $3"


def produce(producer_id: str, seq: int, seconds: int = 0) -> ProduceCommand:
    return ProduceCommand(
        WRITER,
        [record()],
        NOW + timedelta(seconds=seconds),
        producer=ProducerClaim(producer_id=producer_id, epoch=0, seq=seq),
    )


async def test_an_append_stores_no_producer_in_the_snapshot_and_touches_only_its_own(
    pool: asyncpg.Pool,
) -> None:
    streams = PostgresStreams(pool)
    key = new_key()
    await streams.create(key, definition(), NOW)
    await streams.update(key, [produce(f"p{n:03d}", 0, n) for n in range(200)])
    size = await pool.fetchval(f"SELECT octet_length(state) FROM streams WHERE {KEY}", *key)
    assert size < 400  # the 200 producers are not in it
    before = {
        r[0]: r[1]
        for r in await pool.fetch(
            f"SELECT producer_id, xmin::text FROM stream_producers WHERE {KEY}", *key
        )
    }
    assert len(before) == 200
    [done] = await streams.update(key, [produce("p007", 1, 500)])
    assert not done.answer.duplicate and done.answer.producer_seq == 1
    after = {
        r[0]: r[1]
        for r in await pool.fetch(
            f"SELECT producer_id, xmin::text FROM stream_producers WHERE {KEY}", *key
        )
    }
    assert [p for p in after if after[p] != before[p]] == ["p007"]  # one row written, no other
    assert await pool.fetchval(f"SELECT octet_length(state) FROM streams WHERE {KEY}", *key) < 400
    [duplicate] = await streams.update(key, [produce("p150", 0, 501)])
    assert duplicate.answer.duplicate
    stored = await streams.load(key)
    assert len(stored.state.producers) == 200
    assert Stream.replay(key, await streams.journal(key)).state == stored.state


@pytest.fixture
async def before_0491(postgres_admin_url: str, tmp_path: Path) -> AsyncIterator[str]:
    """A database migrated up to the migration before 0491."""
    async with database_before(postgres_admin_url, 491, tmp_path) as url:
        yield url


async def test_migration_0491_moves_the_producers_out_of_the_snapshots(before_0491: str) -> None:
    key = StreamKey("t1", "run-" + secrets.token_hex(4), "s")
    producers = {
        "alpha": Producer(epoch=2, last_seq=7, updated_at=NOW),
        "beta": Producer(epoch=0, last_seq=0, updated_at=NOW + timedelta(seconds=1)),
    }
    state = StreamState(version=3, created_at=NOW, head=2, total_items=2, producers=producers)
    conn = await asyncpg.connect(before_0491)
    try:
        await conn.execute(
            "INSERT INTO streams (tenant, run_id, stream_id, definition, created_at, version,"
            " head, state) VALUES ($1, $2, $3, $4, $5, 3, 2, $6)",
            *key,
            encode_definition(definition()),
            NOW,
            encode_state(state),
        )
        assert "0491_stream_producers.sql" in await migrate(conn)
        row_state = await conn.fetchval(f"SELECT state FROM streams WHERE {KEY}", *key)
        assert b"producers" not in row_state
    finally:
        await conn.close()
    pool = await asyncpg.create_pool(before_0491, min_size=1, max_size=2)
    try:
        streams = PostgresStreams(pool)
        stored = await streams.load(key)
        assert stored.state == state  # the same state, read from the rows
        [stale] = await streams.update(key, [produce("alpha", 7)])  # epoch 0 < 2
        assert isinstance(stale, Failed) and isinstance(stale.error, errors.ProducerEpochStale)
        [again] = await streams.update(
            key,
            [
                ProduceCommand(
                    WRITER, [record()], NOW, producer=ProducerClaim("alpha", epoch=2, seq=7)
                )
            ],
        )
        assert again.answer.duplicate
        [next_one] = await streams.update(
            key,
            [
                ProduceCommand(
                    WRITER, [record()], NOW, producer=ProducerClaim("alpha", epoch=2, seq=8)
                )
            ],
        )
        assert not next_one.answer.duplicate and next_one.answer.head == 3
    finally:
        await pool.close()
