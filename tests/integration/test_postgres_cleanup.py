"""Storage cleanup on PostgreSQL: the shared contract, plus the done deletion-outbox rows and
the gap evidence only PostgreSQL keeps."""

from __future__ import annotations

from datetime import timedelta

import asyncpg
import pytest

from adapters.postgres.cleanup import PostgresCleanup
from adapters.postgres.deliveries import PostgresInputDeliveries
from adapters.postgres.streams import PostgresStreams
from application.set_legal_hold import LegalHoldCommand
from domain.stream import StreamKey
from tests.support.builders import NOW, definition, new_key
from tests.support.cleanup_contract import StorageCleanupContract


class TestPostgresCleanup(StorageCleanupContract):
    @pytest.fixture
    def repo(self, pool: asyncpg.Pool) -> PostgresStreams:
        return PostgresStreams(pool)

    @pytest.fixture
    def deliveries(self, pool: asyncpg.Pool) -> PostgresInputDeliveries:
        return PostgresInputDeliveries(pool, "cleanup-test")

    @pytest.fixture
    def cleanup(self, pool: asyncpg.Pool) -> PostgresCleanup:
        self._pool = pool
        return PostgresCleanup(pool)

    async def deliver(self, key: StreamKey, through: int, ago: timedelta) -> None:
        await self._pool.execute(
            """UPDATE input_deliveries SET delivered_at = now() - $5::interval
               WHERE tenant = $1 AND run_id = $2 AND stream_id = $3 AND sequence <= $4""",
            *key,
            through,
            ago,
        )

    async def rows(self, key: StreamKey) -> int:
        return await self._pool.fetchval(
            "SELECT count(*) FROM input_deliveries "
            "WHERE tenant = $1 AND run_id = $2 AND stream_id = $3",
            *key,
        )


async def _stream(pool: asyncpg.Pool, held: bool = False) -> StreamKey:
    repo = PostgresStreams(pool)
    key = new_key()
    await repo.create(key, definition(), NOW)
    if held:
        await repo.update(key, [LegalHoldCommand(True, "audit", NOW)])
    return key


async def _outbox(pool: asyncpg.Pool, key: StreamKey, done_ago: timedelta | None) -> None:
    await pool.execute(
        """INSERT INTO deletion_outbox
               (tenant, run_id, stream_id, storage_region, storage_key, reason, done_at)
           VALUES ($1, $2, $3, 'local', $1 || '/' || $2 || '/' || $3 || '/' || gen_random_uuid(),
                   'aborted', now() - $4::interval)""",
        *key,
        done_ago,
    )


async def _count(pool: asyncpg.Pool, table: str, key: StreamKey) -> int:
    return await pool.fetchval(
        f"SELECT count(*) FROM {table} WHERE tenant = $1 AND run_id = $2 AND stream_id = $3", *key
    )


async def test_done_outbox_rows_older_than_the_age_go_and_pending_ones_stay(
    pool: asyncpg.Pool,
) -> None:
    key, held = await _stream(pool), await _stream(pool, held=True)
    for k in (key, held):
        await _outbox(pool, k, timedelta(hours=2))  # done long ago
        await _outbox(pool, k, timedelta(0))  # done just now
        await _outbox(pool, k, None)  # not done: its body is still to be removed
    cleanup = PostgresCleanup(pool)
    assert await cleanup.forget_done_deletions(timedelta(hours=1), batch=1) >= 1
    assert await _count(pool, "deletion_outbox", key) == 2
    assert await _count(pool, "deletion_outbox", held) == 3
    await cleanup.forget_done_deletions(timedelta(0))
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM deletion_outbox "
            "WHERE tenant = $1 AND run_id = $2 AND done_at IS NULL",
            key.tenant,
            key.run_id,
        )
        == await _count(pool, "deletion_outbox", key)
        == 1
    )


async def test_gap_evidence_older_than_the_age_goes_but_a_held_streams_stays(
    pool: asyncpg.Pool,
) -> None:
    key, held = await _stream(pool), await _stream(pool, held=True)
    for k in (key, held):
        for ago in (timedelta(hours=2), timedelta(0)):
            await pool.execute(
                """INSERT INTO gap_evidence
                       (tenant, run_id, stream_id, expected, seen, detected_by, repaired_at)
                   VALUES ($1, $2, $3, 5, 7, 'head-check', now() - $4::interval)""",
                *k,
                ago,
            )
    cleanup = PostgresCleanup(pool)
    assert await cleanup.forget_gap_evidence(timedelta(hours=1), batch=1) >= 1
    assert await _count(pool, "gap_evidence", key) == 1
    assert await _count(pool, "gap_evidence", held) == 2


async def test_a_sweep_does_not_wait_for_a_locked_stream_row(pool: asyncpg.Pool) -> None:
    """An append holds the stream row for its transaction: the sweeps read the hold without
    taking or waiting for that lock."""
    key = await _stream(pool)
    await _outbox(pool, key, timedelta(hours=2))
    async with pool.acquire() as holder, holder.transaction():
        await holder.execute(
            "SELECT 1 FROM streams WHERE tenant = $1 AND run_id = $2 AND stream_id = $3 FOR UPDATE",
            *key,
        )
        async with pool.acquire() as sweeper:
            await sweeper.execute("SET lock_timeout = '2s'")
            await PostgresCleanup(sweeper).forget_done_deletions(timedelta(hours=1))
    assert await _count(pool, "deletion_outbox", key) == 0


async def test_rows_a_sweep_keeps_do_not_stop_it_reaching_younger_ones(
    pool: asyncpg.Pool,
) -> None:
    """Held rows older than removable ones, one row per batch: each batch starts where the last
    ended, and every removable row still goes."""
    key, held = await _stream(pool), await _stream(pool, held=True)
    for k, hours in [(held, 9), (held, 8), (key, 7), (held, 6), (key, 5), (key, 5)]:
        await pool.execute(
            """INSERT INTO gap_evidence
                   (tenant, run_id, stream_id, expected, seen, detected_by, repaired_at)
               VALUES ($1, $2, $3, 5, 7, 'head-check', now() - make_interval(hours => $4))""",
            *k,
            hours,
        )
    await PostgresCleanup(pool).forget_gap_evidence(timedelta(hours=1), batch=1)
    assert await _count(pool, "gap_evidence", key) == 0
    assert await _count(pool, "gap_evidence", held) == 3
