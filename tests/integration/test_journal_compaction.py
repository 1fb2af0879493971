"""Snapshots bound the journal, end to end: a real server process snapshots every few events,
real worker processes compact, a legal hold keeps the journal whole, and a compaction whose
worker is killed -9 is finished by another once the lease runs out."""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import AsyncIterator, Iterator

import asyncpg
import httpx
import pytest

from adapters.postgres.journal import (
    PostgresCompactionJobs,
    PostgresJournalCompactor,
    schedule_compaction,
)
from adapters.postgres.streams import PostgresStreams
from application.compaction import CompactionJob
from domain.events import StreamCreated, StreamSnapshotted, decode_event
from domain.state import decode_consumers, decode_state
from domain.stream import Stream, StreamKey
from tests.conftest import SERVER_ENV, api_client
from tests.support.builders import NOW, append, definition
from tests.support.server import ServerProcess, WorkerProcess

EVERY = 10
TENANT = "default"  # the bootstrap token's
WORKER_ENV = {
    "DUCTOR_STREAMS_SNAPSHOT_EVERY_EVENTS": str(EVERY),
    "DUCTOR_STREAMS_WORKER_POLL_SECONDS": "0.05",
    "DUCTOR_STREAMS_PRUNE_INTERVAL_SECONDS": "0.2",  # a held stream's job looks again this often
    "DUCTOR_STREAMS_RETRY_BASE_SECONDS": "0.05",
    "DUCTOR_STREAMS_WORKER_LEASE_SECONDS": "1",
    "DUCTOR_STREAMS_LOG_LEVEL": "INFO",
}
_KEY = "tenant = $1 AND run_id = $2 AND stream_id = $3"


@pytest.fixture(scope="module")
def snapshotting_server(
    own_database: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = ServerProcess(
        database_url=own_database,
        data_dir=tmp_path_factory.mktemp("server"),
        env={**SERVER_ENV, "DUCTOR_STREAMS_SNAPSHOT_EVERY_EVENTS": str(EVERY)},
    ).start()
    yield process
    process.stop()


@pytest.fixture
async def api(snapshotting_server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(snapshotting_server) as client:
        yield client


def start_worker(database_url: str, tmp_path_factory: pytest.TempPathFactory, **env: str):
    return WorkerProcess(
        database_url=database_url,
        data_dir=tmp_path_factory.mktemp("worker"),
        env={**WORKER_ENV, **env},
    ).start()


def worker_id(process: WorkerProcess) -> str:
    found = re.search(r"workers running \(worker id ([^)]+)\)", process.log())
    assert found, process.log()
    return found.group(1)


async def create(api: httpx.AsyncClient, run_id: str, stream_id: str) -> str:
    answer = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": stream_id, "direction": "output"}
    )
    assert answer.status_code == 201, answer.text
    return f"/runs/{run_id}/streams/{stream_id}"


async def post_records(api: httpx.AsyncClient, path: str, count: int = 1) -> None:
    answer = await api.post(
        f"{path}/records", json={"records": [{"data": n} for n in range(count)]}
    )
    assert answer.status_code == 201, answer.text


async def journal_rows(pool: asyncpg.Pool, key: StreamKey) -> int:
    return await pool.fetchval(f"SELECT count(*) FROM stream_events WHERE {_KEY}", *key)


async def compaction_job(pool: asyncpg.Pool, key: StreamKey) -> asyncpg.Record | None:
    return await pool.fetchrow(f"SELECT * FROM journal_compaction_jobs WHERE {_KEY}", *key)


async def compacted(pool: asyncpg.Pool, key: StreamKey, timeout: float = 15) -> None:
    async with asyncio.timeout(timeout):
        while await compaction_job(pool, key) is not None:
            await asyncio.sleep(0.05)


async def replays_into_the_stored_state(pool: asyncpg.Pool, key: StreamKey) -> list:
    """Every stored journal row, replayed, equals the stream row's snapshot."""
    rows = await pool.fetch(
        f"SELECT payload FROM stream_events WHERE {_KEY} ORDER BY version", *key
    )
    journal = [decode_event(r[0]) for r in rows]
    row = await pool.fetchrow(f"SELECT state, consumers FROM streams WHERE {_KEY}", *key)
    stored = decode_state(row["state"])  # the snapshot, and its consumers beside it
    stored.consumers = decode_consumers(row["consumers"] or b"{}")
    assert Stream.replay(key, journal).state == stored
    return journal


async def test_many_appends_leave_a_bounded_journal_that_replays_into_the_stored_state(
    api: httpx.AsyncClient,
    own_database: str,
    own_pool: asyncpg.Pool,
    run_id: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    worker = start_worker(own_database, tmp_path_factory)
    try:
        path = await create(api, run_id, "busy")
        key = StreamKey(TENANT, run_id, "busy")
        for round_ in range(12):
            # Five at a time, so that group commit puts several appends in one transaction.
            await asyncio.gather(*(post_records(api, path, 1 + n % 3) for n in range(5)))
            ack = await api.post(f"{path}/consumers/c/ack", json={"sequence": round_ * 5})
            assert ack.status_code == 200, ack.text
        await compacted(own_pool, key)
        document = (await api.get(path)).json()
        assert document["state"]["head"] == 12 * (1 + 2 + 3 + 1 + 2)
        version = await own_pool.fetchval(f"SELECT version FROM streams WHERE {_KEY}", *key)
        assert version > 6 * EVERY  # past several snapshots
        assert await journal_rows(own_pool, key) <= EVERY + 5  # 5: the largest group
        journal = await replays_into_the_stored_state(own_pool, key)
        assert isinstance(journal[0], StreamSnapshotted)
        assert "compacted the journal below version" in worker.log()
    finally:
        worker.stop()


async def test_a_held_stream_keeps_its_journal_until_the_hold_is_lifted(
    api: httpx.AsyncClient,
    own_database: str,
    own_pool: asyncpg.Pool,
    run_id: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    worker = start_worker(own_database, tmp_path_factory)
    try:
        path = await create(api, run_id, "held")
        key = StreamKey(TENANT, run_id, "held")
        hold = await api.put(f"{path}/legal-hold", json={"enabled": True, "reason": "audit"})
        assert hold.status_code == 200, hold.text
        for _ in range(3 * EVERY):
            await post_records(api, path)
        job = await compaction_job(own_pool, key)
        assert job is not None
        # The worker looks at the job (and puts it off) again and again; nothing goes meanwhile.
        for _ in range(3):
            seen = job["next_attempt_at"]
            async with asyncio.timeout(10):
                while (job := await compaction_job(own_pool, key))["next_attempt_at"] == seen:
                    await asyncio.sleep(0.05)
            version = await own_pool.fetchval(f"SELECT version FROM streams WHERE {_KEY}", *key)
            assert await journal_rows(own_pool, key) == version
        journal = await replays_into_the_stored_state(own_pool, key)
        assert isinstance(journal[0], StreamCreated)  # nothing went

        lifted = await api.put(f"{path}/legal-hold", json={"enabled": False, "reason": None})
        assert lifted.status_code == 200, lifted.text
        await compacted(own_pool, key)
        assert await journal_rows(own_pool, key) <= EVERY
        journal = await replays_into_the_stored_state(own_pool, key)
        assert isinstance(journal[0], StreamSnapshotted)
    finally:
        worker.stop()


@pytest.mark.slow
async def test_a_compaction_whose_worker_is_killed_is_finished_by_another_after_the_lease(
    api: httpx.AsyncClient,
    own_database: str,
    own_pool: asyncpg.Pool,
    run_id: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    path = await create(api, run_id, "taken-over")
    key = StreamKey(TENANT, run_id, "taken-over")
    for _ in range(4):
        await post_records(api, path)  # versions 2..5
    # A reader's row lock on version 5 stalls the compaction there, with its claim held.
    blocker = await asyncpg.connect(own_database)
    first = second = None
    try:
        stall = blocker.transaction()
        await stall.start()
        await blocker.execute(
            f"SELECT 1 FROM stream_events WHERE {_KEY} AND version = 5 FOR UPDATE", *key
        )
        for _ in range(EVERY):
            await post_records(api, path)  # crosses version 10: the snapshot and its job
        batches = {"DUCTOR_STREAMS_COMPACTION_BATCH_EVENTS": "2"}
        first = start_worker(own_database, tmp_path_factory, **batches)
        holder = worker_id(first)
        async with asyncio.timeout(10):
            while await own_pool.fetchval(
                f"SELECT count(*) FROM stream_events WHERE {_KEY} AND version < 5", *key
            ):
                await asyncio.sleep(0.05)  # its first batches went; the next one waits
        await asyncio.sleep(1.5)  # longer than the lease: the live worker renews its claim
        assert (await compaction_job(own_pool, key))["claimed_by"] == holder

        first.kill()
        await stall.rollback()
        second = start_worker(own_database, tmp_path_factory, **batches)
        await compacted(own_pool, key)
        assert "compacted the journal below version" in second.log()
        assert await journal_rows(own_pool, key) <= EVERY
        journal = await replays_into_the_stored_state(own_pool, key)
        assert isinstance(journal[0], StreamSnapshotted)
    finally:
        await blocker.close()
        for process in (first, second):
            if process is not None:
                process.stop()


async def test_a_snapshot_taken_while_its_job_runs_brings_the_job_back_when_it_is_done(
    own_pool: asyncpg.Pool,
) -> None:
    key = StreamKey(TENANT, "run-" + secrets.token_hex(4), "moved")
    queue = PostgresCompactionJobs(own_pool, "queue-test", lease_seconds=30)
    await schedule(own_pool, key, 11)
    [job] = [j for j in await queue.claim(100) if j.key == key]
    assert isinstance(job, CompactionJob) and job.through_version == 11
    await schedule(own_pool, key, 21)  # the next snapshot, while the job runs
    await schedule(own_pool, key, 5)  # never moves back
    await queue.done(job, None)
    row = await compaction_job(own_pool, key)
    assert (row["through_version"], row["claimed_by"]) == (21, None)  # due again, unclaimed
    [again] = [j for j in await queue.claim(100) if j.key == key]
    assert again.through_version == 21
    await queue.done(again, None)
    assert await compaction_job(own_pool, key) is None


async def test_compaction_never_passes_the_latest_snapshot_journaled(
    own_pool: asyncpg.Pool,
) -> None:
    """A job left behind by an erased stream must not touch the journal of its successor."""
    key = StreamKey(TENANT, "run-" + secrets.token_hex(4), "recreated")
    streams = PostgresStreams(own_pool, snapshot_every=5)
    await streams.create(key, definition(), NOW)
    for _ in range(7):
        await streams.update(key, [append()])  # a snapshot at 6, then versions 7..9
    compactor = PostgresJournalCompactor(own_pool)
    assert await compactor.compact(key, 10**6, batch=2) == 5
    assert await journal_rows(own_pool, key) == 4
    assert await compactor.compact(key, 10**6, batch=2) == 0
    await replays_into_the_stored_state(own_pool, key)


async def schedule(pool: asyncpg.Pool, key: StreamKey, through: int) -> None:
    async with pool.acquire() as conn:
        await schedule_compaction(conn, key, through)
