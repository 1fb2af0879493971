"""Leased jobs on real PostgreSQL: a live worker keeps what it renews, a dead one's claims are
taken over within seconds."""

from __future__ import annotations

import asyncio
import re
import secrets
import time

import asyncpg
import pytest

from adapters.postgres.deliveries import PostgresInputDeliveries
from adapters.postgres.jobs import PostgresDeletionJobs, PostgresRetentionJobs
from adapters.postgres.journal import PostgresCompactionJobs
from application.workers import Job, Worker
from tests.conftest import SERVER_ENV, api_client
from tests.support.server import ServerProcess, WorkerProcess
from tests.support.wait_stub import WaitServiceStub

LEASE = 0.6


async def add_retention_job(pool: asyncpg.Pool, stream_id: str) -> None:
    await pool.execute(
        "INSERT INTO retention_jobs (tenant, run_id, stream_id) VALUES ('t', 'r', $1)", stream_id
    )


async def add_deletion_job(pool: asyncpg.Pool, stream_id: str) -> None:
    await pool.execute(
        "INSERT INTO deletion_outbox (tenant, run_id, stream_id, storage_region, storage_key,"
        " reason) VALUES ('t', 'r', $1, 'local', $2, 'test')",
        stream_id,
        f"t/r/{stream_id}/o",
    )


async def add_input_delivery(pool: asyncpg.Pool, stream_id: str) -> None:
    await pool.execute(
        "INSERT INTO input_deliveries (tenant, run_id, stream_id, sequence)"
        " VALUES ('t', 'r', $1, 1)",
        stream_id,
    )


async def add_compaction_job(pool: asyncpg.Pool, stream_id: str) -> None:
    await pool.execute(
        "INSERT INTO journal_compaction_jobs (tenant, run_id, stream_id, through_version)"
        " VALUES ('t', 'r', $1, 1001)",
        stream_id,
    )


QUEUES = {
    "retention": (PostgresRetentionJobs, add_retention_job),
    "journal compaction": (PostgresCompactionJobs, add_compaction_job),
    "deletion": (PostgresDeletionJobs, add_deletion_job),
    "input dispatch": (PostgresInputDeliveries, add_input_delivery),
}


@pytest.mark.parametrize("kind", QUEUES)
async def test_a_job_that_runs_past_its_lease_is_not_claimed_by_a_second_worker(
    own_pool: asyncpg.Pool, kind: str
) -> None:
    queue_type, add_job = QUEUES[kind]
    slow_stream, waiting_stream = "slow-" + secrets.token_hex(3), "next-" + secrets.token_hex(3)
    await add_job(own_pool, slow_stream)
    await add_job(own_pool, waiting_stream)
    first = queue_type(own_pool, "first", lease_seconds=LEASE)
    second = queue_type(own_pool, "second", lease_seconds=LEASE)
    handled: list[str] = []
    finished = asyncio.Event()

    async def handle(job: Job) -> None:
        handled.append(job.key.stream_id)
        if job.key.stream_id == slow_stream:
            await asyncio.sleep(LEASE * 4)  # alive, renewing, and slow
        if len(handled) == 2:
            finished.set()

    stopping = asyncio.Event()
    worker = asyncio.create_task(Worker("first", first, handle, poll_seconds=0.05).run(stopping))
    try:
        async with asyncio.timeout(5):
            while not handled:
                await asyncio.sleep(0.01)
        # Both jobs are the first worker's: the one it runs and the one it has not started.
        stolen: list[Job] = []
        deadline = time.monotonic() + LEASE * 3
        while time.monotonic() < deadline and not finished.is_set():
            stolen += await second.claim(10)
            await asyncio.sleep(0.05)
        assert stolen == []
        await asyncio.wait_for(finished.wait(), 10)
    finally:
        stopping.set()
        await asyncio.wait_for(worker, 10)
    assert handled == [slow_stream, waiting_stream]  # once each, by the worker that claimed them


async def test_a_claim_nobody_renews_is_taken_over_once_its_lease_runs_out(
    own_pool: asyncpg.Pool,
) -> None:
    stream_id = "dead-" + secrets.token_hex(3)
    await add_input_delivery(own_pool, stream_id)
    dead = PostgresInputDeliveries(own_pool, "dead", lease_seconds=LEASE)
    alive = PostgresInputDeliveries(own_pool, "alive", lease_seconds=LEASE)
    [claimed] = [j for j in await dead.claim(10) if j.key.stream_id == stream_id]
    assert [j for j in await alive.claim(10) if j.key.stream_id == stream_id] == []
    await asyncio.sleep(LEASE + 0.2)
    taken = [j for j in await alive.claim(10) if j.key.stream_id == stream_id]
    assert [j.key for j in taken] == [claimed.key]
    assert await dead.renew([claimed]) == [claimed]  # the dead worker, back, learns it is gone
    assert await alive.renew(taken) == []


# --- two `ductor-streams worker` processes, one killed -9 ------------------------------------


WORKER_ENV = {
    "DUCTOR_STREAMS_WORKER_POLL_SECONDS": "0.05",
    "DUCTOR_STREAMS_DISPATCH_POLL_SECONDS": "0.05",
    "DUCTOR_STREAMS_RETRY_BASE_SECONDS": "0.02",
    # The lease is the service's default (DUCTOR_STREAMS_WORKER_LEASE_SECONDS is not set).
}


def worker_id(process: WorkerProcess) -> str:
    found = re.search(r"workers running \(worker id ([^)]+)\)", process.log())
    assert found, process.log()
    return found.group(1)


async def holders(pool: asyncpg.Pool, run_id: str) -> dict[str, str | None]:
    rows = await pool.fetch(
        "SELECT DISTINCT ON (stream_id) stream_id, claimed_by FROM input_deliveries"
        " WHERE run_id = $1 AND delivered_at IS NULL ORDER BY stream_id, sequence",
        run_id,
    )
    return {r["stream_id"]: r["claimed_by"] for r in rows}


@pytest.mark.slow
async def test_a_killed_dispatchers_streams_resume_within_ten_seconds(
    own_database: str, own_pool: asyncpg.Pool, tmp_path_factory: pytest.TempPathFactory
) -> None:
    run_id = "run-" + secrets.token_hex(4)
    streams, per_stream = ["a", "b"], 120
    with WaitServiceStub(fail_every=10**9, lose_answer_every=10**9, delay=0.1) as stub:
        env = {
            **WORKER_ENV,
            "DUCTOR_STREAMS_WAIT_SERVICE": "http",
            "DUCTOR_STREAMS_WAIT_SERVICE_URL": stub.url,
        }
        server = ServerProcess(
            database_url=own_database, data_dir=tmp_path_factory.mktemp("s"), env=SERVER_ENV
        ).start()
        first = second = None
        try:
            async with api_client(server) as api:
                for stream_id in streams:
                    created = await api.post(
                        f"/runs/{run_id}/streams",
                        json={"stream_id": stream_id, "direction": "input"},
                    )
                    assert created.status_code == 201, created.text
                    answer = await api.post(
                        f"/runs/{run_id}/streams/{stream_id}/records",
                        json={"records": [{"data": n} for n in range(per_stream)]},
                    )
                    assert answer.status_code == 201, answer.text
            first = WorkerProcess(
                database_url=own_database, data_dir=tmp_path_factory.mktemp("w1"), env=env
            ).start()
            holder = worker_id(first)
            async with asyncio.timeout(10):  # the first worker holds both streams
                while set((await holders(own_pool, run_id)).values()) != {holder}:
                    await asyncio.sleep(0.05)
            second = WorkerProcess(
                database_url=own_database, data_dir=tmp_path_factory.mktemp("w2"), env=env
            ).start()

            # Longer than a lease: the slow but alive first worker keeps both streams.
            settle = time.monotonic() + 8
            while time.monotonic() < settle:
                assert set((await holders(own_pool, run_id)).values()) == {holder}
                await asyncio.sleep(0.1)
            assert stub.duplicates == 0

            first.kill()
            killed = time.monotonic()
            await asyncio.sleep(0.3)  # a publish in flight at the kill may still land
            before = {s: len(stub.sequences(s)) for s in streams}
            resumed: dict[str, float] = {}
            async with asyncio.timeout(15):
                while len(resumed) < len(streams):
                    for s in streams:
                        if s not in resumed and len(stub.sequences(s)) > before[s]:
                            resumed[s] = time.monotonic() - killed
                    await asyncio.sleep(0.05)
            assert max(resumed.values()) < 10, resumed
            assert stub.duplicates <= len(streams)  # at most the publish each had in flight

            async with asyncio.timeout(60):
                while any(len(stub.sequences(s)) < per_stream for s in streams):
                    await asyncio.sleep(0.1)
            for s in streams:
                assert stub.sequences(s) == list(range(1, per_stream + 1))  # in order, no gap
        finally:
            for process in (first, second, server):
                if process is not None:
                    process.stop()


async def test_a_dispatcher_moving_down_a_backlog_keeps_its_claim_through_each_renewal(
    own_pool: asyncpg.Pool,
) -> None:
    """A renewal that meets `advance` moving the claim from record n to n+1 (its row locked,
    then delivered) still finds the claim on n+1: the job is not cancelled as taken over."""
    stream_id = "backlog-" + secrets.token_hex(3)
    n = 400
    await own_pool.execute(
        "INSERT INTO input_deliveries (tenant, run_id, stream_id, sequence)"
        " SELECT 't', 'r', $1, s FROM generate_series(1, $2) AS s",
        stream_id,
        n,
    )
    deliveries = PostgresInputDeliveries(own_pool, "first", lease_seconds=LEASE)
    runs: list[int] = []
    cancelled: list[int] = []
    done = asyncio.Event()

    async def handle(job: Job) -> None:  # what Dispatch.run_job does, minus the publishing
        runs.append(job.id or 0)
        current: Job | None = job
        try:
            while current is not None:
                await asyncio.sleep(0.002)  # a quick wait service
                last = current.id
                current = await deliveries.advance(current)
        except asyncio.CancelledError:
            cancelled.append(last or 0)
            raise
        if last == n:
            done.set()

    stopping = asyncio.Event()
    worker = asyncio.create_task(
        Worker("first", deliveries, handle, poll_seconds=0.05).run(stopping)
    )
    try:
        await asyncio.wait_for(done.wait(), 60)
    finally:
        stopping.set()
        await worker
    assert cancelled == [] and runs == [1]  # one claim, followed to the end, never cancelled
