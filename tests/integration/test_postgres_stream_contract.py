"""The stream-port contract on PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import secrets
from datetime import timedelta

import asyncpg
import msgspec
import pytest

from adapters.postgres.erasure import erase
from adapters.postgres.journal import PostgresJournalCompactor
from adapters.postgres.streams import PostgresStreams
from adapters.postgres.wake_bus import PostgresWakeBus
from application.acknowledge import AckCommand
from application.compaction import CompactionJob, CompactJournal
from application.delete_stream import DeleteCommand
from application.errors import NotFound
from application.expiry import ExpireCommand
from application.wake import WakeRegistry
from domain import errors
from domain.definition import Expiry
from domain.state import decode_state
from domain.stream import StreamKey
from tests.support.builders import NOW, WRITER, append, definition, new_key, record
from tests.support.stream_contract import (
    SNAPSHOT_EVERY,
    CrossStreamContract,
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
    CrossStreamContract,
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


async def test_an_append_neither_reads_nor_rewrites_the_consumers(pool: asyncpg.Pool) -> None:
    """They are stored beside the snapshot (migration 0488), which every append rewrites."""
    repo, key = PostgresStreams(pool), new_key()
    await repo.create(key, definition(), NOW)
    await repo.update(key, [AckCommand(WRITER, f"c{n}", 0, NOW) for n in range(50)])
    before = await pool.fetchrow(f"SELECT state, consumers FROM streams WHERE {_KEY}", *key)
    assert b"c49" not in before["state"] and b"c49" in before["consumers"]
    await repo.update(key, [append()])
    after = await pool.fetchrow(f"SELECT state, consumers FROM streams WHERE {_KEY}", *key)
    assert after["consumers"] == before["consumers"]
    stored = decode_state(after["state"])
    assert (stored.consumers, stored.consumer_count, stored.holding_count) == ({}, 50, 50)
    assert stored.credit_floor is not None and stored.credit_floor.sequence == 0


async def test_a_snapshot_written_before_the_consumers_moved_out_is_read_and_moved(
    pool: asyncpg.Pool,
) -> None:
    """A state stored before migration 0488 carried its consumers and no counts: it decodes
    with them (the counts and the credit floor derived), and its next write moves them to
    their column."""
    repo, key = PostgresStreams(pool), new_key()
    await repo.create(key, definition(max_unread_items=3), NOW)
    await repo.update(key, [append([record(), record()])])
    [done] = await repo.update(key, [AckCommand(WRITER, "old", 1, NOW)])
    assert done.answer.credit.unread_items == 1
    # The row as an earlier version wrote it: consumers in the state, none beside it.
    legacy = json.loads(await pool.fetchval(f"SELECT state FROM streams WHERE {_KEY}", *key))
    for name in ("consumer_count", "holding_count", "credit_floor"):
        del legacy[name]
    legacy["consumers"] = {
        "old": {
            "principal": WRITER.principal,
            "acked_sequence": 1,
            "acked_offset": len(record().payload),
            "updated_at": NOW.isoformat(),
        }
    }
    await pool.execute(
        f"UPDATE streams SET state = $4, consumers = NULL WHERE {_KEY}",
        *key,
        json.dumps(legacy).encode(),
    )
    loaded = await repo.load(key)
    assert list(loaded.state.consumers) == ["old"] and loaded.credit().unread_items == 1
    [appended, refused] = await repo.update(key, [append([record()] * 2), append()])
    assert appended.answer.head == 4
    assert isinstance(refused.error, errors.Backpressure)  # the old consumer still holds
    row = await pool.fetchrow(f"SELECT state, consumers FROM streams WHERE {_KEY}", *key)
    assert b'"old"' not in row["state"] and b'"old"' in row["consumers"]
    [acked] = await repo.update(key, [AckCommand(WRITER, "old", 4, NOW)])
    assert acked.answer.credit.unread_items == 0


class _CountingPool:
    """The pool, counting the payload bytes its statements bring back (column 14 of a page's
    rows is a record's payload)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self.payload_bytes = 0

    def __getattr__(self, name: str):
        return getattr(self._pool, name)

    async def fetch(self, query: str, *args):
        rows = await self._pool.fetch(query, *args)
        self.payload_bytes += sum(len(r[14]) for r in rows if len(r) > 14 and r[14] is not None)
        return rows


async def test_a_forks_page_within_a_budget_reads_no_more_of_its_ancestors_than_that(
    pool: asyncpg.Pool,
) -> None:
    """A fork of 100 records of 60 KB, read a page of up to 1,000 records within 256 KiB: the
    source's segment is cut in the statement too, not read 100 records deep and cut after."""
    counting = _CountingPool(pool)
    repo = PostgresStreams(counting)  # type: ignore[arg-type]
    src_key = new_key()
    await repo.create(src_key, definition(), NOW)
    big = b"x" * 60_000
    await repo.update(src_key, [append([record(big) for _ in range(100)])])
    src = await repo.load(src_key)
    fork_key = src_key._replace(stream_id="fork")
    await repo.create(fork_key, forked(src, "fork", 100), NOW)
    budget = 256 * 1024
    counting.payload_bytes = 0
    found = await repo.page(fork_key, 0, 1_000, budget)
    assert found is not None
    assert [r.sequence for r in found[1]] == [1, 2, 3, 4]  # 4 x 60,000 <= 262,144 < 5 x
    assert counting.payload_bytes <= budget + 60_000, counting.payload_bytes
