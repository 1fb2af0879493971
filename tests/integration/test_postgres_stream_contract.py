"""The stream-port contract on PostgreSQL."""

from __future__ import annotations

import secrets

import asyncpg
import pytest

from adapters.postgres.journal import PostgresJournalCompactor
from adapters.postgres.streams import PostgresStreams
from adapters.postgres.wake_bus import PostgresWakeBus
from application.compaction import CompactionJob, CompactJournal
from application.wake import WakeRegistry
from domain.stream import StreamKey
from tests.support.stream_contract import (
    SNAPSHOT_EVERY,
    DurableStreamsContract,
    JournalContract,
    ObjectIntentsContract,
    StreamRepositoryContract,
)

_KEY = "tenant = $1 AND run_id = $2 AND stream_id = $3"


class TestPostgresStreams(
    StreamRepositoryContract, ObjectIntentsContract, JournalContract, DurableStreamsContract
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
