"""The stream-port contract on PostgreSQL."""

from __future__ import annotations

import asyncio
import secrets
from datetime import timedelta

import asyncpg
import msgspec
import pytest

from adapters.postgres.erasure import erase
from adapters.postgres.journal import PostgresJournalCompactor
from adapters.postgres.streams import PostgresStreams
from adapters.postgres.wake_bus import PostgresWakeBus
from application.compaction import CompactionJob, CompactJournal
from application.delete_stream import DeleteCommand
from application.errors import NotFound
from application.expiry import ExpireCommand
from application.wake import WakeRegistry
from domain.definition import Expiry
from domain.stream import StreamKey
from tests.support.builders import NOW, append, definition, new_key, record
from tests.support.stream_contract import (
    SNAPSHOT_EVERY,
    DurableStreamsContract,
    ForkContract,
    JournalContract,
    ObjectIntentsContract,
    StreamRepositoryContract,
    forked,
)

_KEY = "tenant = $1 AND run_id = $2 AND stream_id = $3"


class TestPostgresStreams(
    StreamRepositoryContract,
    ObjectIntentsContract,
    JournalContract,
    ForkContract,
    DurableStreamsContract,
):
    @pytest.fixture
    def repo(self, pool: asyncpg.Pool) -> PostgresStreams:
        return PostgresStreams(pool)

    @pytest.fixture
    def reopen(self, pool: asyncpg.Pool):
        """A new adapter, as a restarted process has: nothing but what the database holds."""
        return lambda: PostgresStreams(pool)

    @pytest.fixture
    async def waking_repo(self, pool: asyncpg.Pool, database_url: str):
        registry = WakeRegistry()
        bus = PostgresWakeBus(
            database_url, registry, application_name="ds-test-bus-" + secrets.token_hex(3)
        )
        await bus.start()
        yield PostgresStreams(pool), registry
        await bus.stop()

    @pytest.fixture
    def snapshotting_repo(self, pool: asyncpg.Pool) -> PostgresStreams:
        return PostgresStreams(pool, snapshot_every=SNAPSHOT_EVERY)

    @pytest.fixture
    def compact(self, pool: asyncpg.Pool):
        async def compact(repo: PostgresStreams, key: StreamKey) -> None:
            """Run the stream's compaction job, if it has one, as the compactor does (in
            batches of 3 so that each job takes several)."""
            row = await pool.fetchrow(
                f"SELECT through_version, attempts FROM journal_compaction_jobs WHERE {_KEY}",
                *key,
            )
            if row is None:
                return
            job = CompactionJob(key=key, attempts=row[1], through_version=row[0])
            handler = CompactJournal(repo, PostgresJournalCompactor(pool), batch=3)
            if await handler.run_job(job) is None:
                await pool.execute(
                    f"DELETE FROM journal_compaction_jobs WHERE {_KEY} AND through_version <= $4",
                    *key,
                    job.through_version,
                )

        return compact

    @pytest.fixture
    def journal_rows(self, pool: asyncpg.Pool):
        async def journal_rows(key: StreamKey) -> int:
            return await pool.fetchval(f"SELECT count(*) FROM stream_events WHERE {_KEY}", *key)

        return journal_rows


async def test_a_soft_deleted_source_leaves_the_expiry_sweep_and_its_links_hold_it(
    pool: asyncpg.Pool,
) -> None:
    """PostgreSQL only: a soft delete removes the `stream_access` row (nothing is left to
    expire: only its last fork's erasure erases it), and the foreign key from a link to its
    source refuses an erasure that would lose a fork's prefix."""
    repo = PostgresStreams(pool)
    key = new_key()._replace(stream_id="src")
    expiring = msgspec.structs.replace(definition("src"), expiry=Expiry(idle_seconds=10))
    await repo.create(key, expiring, NOW)
    await repo.update(key, [append([record()])])
    source = await repo.load(key)
    fork_key = key._replace(stream_id="f")
    await repo.create(fork_key, forked(source, "f", 1), NOW)
    assert await pool.fetchval(f"SELECT count(*) FROM stream_access WHERE {_KEY}", *key) == 1
    later = NOW + timedelta(minutes=5)
    await repo.update(key, [ExpireCommand(later, NOW, timedelta(0))])
    assert await pool.fetchval(f"SELECT count(*) FROM stream_access WHERE {_KEY}", *key) == 0
    assert await pool.fetchval(f"SELECT soft_deleted FROM streams WHERE {_KEY}", *key)
    with pytest.raises(asyncpg.ForeignKeyViolationError):
        async with pool.acquire() as conn, conn.transaction():
            await erase(conn, key.tenant, key.run_id, [key.stream_id], "deleted")
    assert await repo.page(fork_key, 0, 10) is not None
    await repo.update(fork_key, [DeleteCommand(NOW)])
    assert await pool.fetchval(f"SELECT count(*) FROM streams WHERE {_KEY}", *key) == 0
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM stream_forks WHERE tenant = $1 AND source_run_id = $2",
            key.tenant,
            key.run_id,
        )
        == 0
    )


async def test_a_fork_waiting_on_its_sources_lock_finds_it_erased_and_leaves_nothing(
    pool: asyncpg.Pool,
) -> None:
    """The interleaving the lock order is for: the source's delete holds its row when the
    fork's creation reaches it; the delete saw no link (there is none yet) and erases it; the
    creation then finds no source (404) and rolls back whole."""
    repo = PostgresStreams(pool)
    key = new_key()._replace(stream_id="src")
    await repo.create(key, definition("src"), NOW)
    await repo.update(key, [append([record()])])
    source = await repo.load(key)
    fork_key = key._replace(stream_id="f")
    async with pool.acquire() as conn:
        transaction = conn.transaction()
        await transaction.start()
        await conn.execute(f"SELECT 1 FROM streams WHERE {_KEY} FOR UPDATE", *key)
        creating = asyncio.create_task(repo.create(fork_key, forked(source, "f", 1), NOW))
        async with asyncio.timeout(10):
            while not await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'"
            ):
                await asyncio.sleep(0.01)  # the creation is waiting on the source's row
        assert not await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM stream_forks WHERE tenant = $1 AND source_run_id = $2"
            " AND source_stream_id = $3)",
            *key,
        )
        await erase(conn, key.tenant, key.run_id, [key.stream_id], "deleted")
        await transaction.commit()
    with pytest.raises(NotFound):
        await creating
    assert await repo.load(fork_key) is None
    assert await pool.fetchval(f"SELECT count(*) FROM stream_forks WHERE {_KEY}", *fork_key) == 0
