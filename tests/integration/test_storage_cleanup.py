"""Storage cleanup end to end: a server, a worker process with short ages and intervals, and
its own database (the short ages would sweep the other tests' rows)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from tests.conftest import SERVER_ENV, api_client
from tests.support.postgres import create_test_database, drop_test_database
from tests.support.server import ServerProcess, WorkerProcess

SHORT = {
    "DUCTOR_STREAMS_WORKER_POLL_SECONDS": "0.05",
    "DUCTOR_STREAMS_DISPATCH_POLL_SECONDS": "0.05",
    "DUCTOR_STREAMS_WORKER_LEASE_SECONDS": "2",
    "DUCTOR_STREAMS_RETRY_BASE_SECONDS": "0.02",
    "DUCTOR_STREAMS_SWEEP_INTERVAL_SECONDS": "0.2",
    "DUCTOR_STREAMS_IDEMPOTENCY_WINDOW_SECONDS": "1",
    "DUCTOR_STREAMS_CLEANUP_AGE_SECONDS": "1",
    "DUCTOR_STREAMS_CLEANUP_INTERVAL_SECONDS": "0.2",
    "DUCTOR_STREAMS_UPLOAD_ABANDONED_SECONDS": "60",
}
SWEEPS = {
    "expire-intents",
    "forget-receipts",
    "forget-delivered-inputs",
    "forget-done-deletions",
    "forget-gap-evidence",
    "forget-ended-tokens",
    "fold-tenant-counts",
}
BODY = os.urandom(100_000)


class Deployment:
    def __init__(self, server: ServerProcess, pool: asyncpg.Pool) -> None:
        self.server = server
        self.pool = pool


@pytest.fixture
async def deployment(postgres_admin_url: str, tmp_path: Path) -> AsyncIterator[Deployment]:
    url, name = await create_test_database(postgres_admin_url)
    # The worker shares the server's data directory: it removes the bodies the server stored.
    server = ServerProcess(database_url=url, data_dir=tmp_path / "data", env=SERVER_ENV)
    worker = WorkerProcess(database_url=url, data_dir=tmp_path / "data", env=SHORT)
    pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
    try:
        await asyncio.to_thread(server.start)
        await asyncio.to_thread(worker.start)
        yield Deployment(server, pool)
    finally:
        await pool.close()
        await asyncio.to_thread(worker.stop)
        await asyncio.to_thread(server.stop)
        await drop_test_database(postgres_admin_url, name)


async def _until(condition, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not await condition():
            await asyncio.sleep(0.1)


async def _input_stream(api: httpx.AsyncClient, run_id: str, stream_id: str) -> str:
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": stream_id, "direction": "input"}
    )
    assert created.status_code == 201, created.text
    return f"/runs/{run_id}/streams/{stream_id}"


async def _append(api: httpx.AsyncClient, path: str, n: int) -> None:
    for i in range(n):
        answer = await api.post(
            f"{path}/records",
            json={"records": [{"data": {"n": i}}]},
            headers={"Idempotency-Key": f"k{i}"},
        )
        assert answer.status_code == 201, answer.text


async def test_delivered_rows_done_outbox_rows_and_receipts_go_but_a_held_streams_stay(
    deployment: Deployment, run_id: str
) -> None:
    pool = deployment.pool
    # What a put killed mid-upload leaves in the filesystem store, and one being written now.
    objects_dir = deployment.server.data_dir / "objects"
    stray_dir = objects_dir / "local" / "default" / "other-run"
    stray_dir.mkdir(parents=True)
    stray, young = stray_dir / ".upload-stray", stray_dir / ".upload-young"
    stray.write_bytes(b"left behind")
    young.write_bytes(b"being written")
    os.utime(stray, (0, 0))

    async def count(table: str, stream_id: str) -> int:
        return await pool.fetchval(
            f"SELECT count(*) FROM {table} WHERE run_id = $1 AND stream_id = $2", run_id, stream_id
        )

    async with api_client(deployment.server) as api:
        free = await _input_stream(api, run_id, "free")
        held = await _input_stream(api, run_id, "held")
        hold = await api.put(f"{held}/legal-hold", json={"enabled": True, "reason": "audit"})
        assert hold.status_code == 200, hold.text
        for path in (free, held):
            await _append(api, path, 4)

        async def delivered() -> bool:
            states = [(await api.get(p)).json()["state"]["input_delivery"] for p in (free, held)]
            return all(s["pending"] == 0 for s in states)

        await _until(delivered)
        before = (await api.get(free)).json()
        assert before["state"]["input_delivery"] == {
            "delivered_through": 4,
            "pending": 0,
            "last_error": None,
        }

        # The delivered rows age past a second and go, all but the highest delivered one.
        async def swept() -> bool:
            return await count("input_deliveries", "free") == 1

        await _until(swept)
        assert (await api.get(free)).json() == before  # the document shows the same
        await _until(lambda: _none_left(pool, run_id, "append_receipts", "free"))

        # An object aborted: its body is removed, its outbox row marked done, then removed.
        created = await api.post(
            f"/runs/{run_id}/streams", json={"stream_id": "o", "direction": "output"}
        )
        assert created.status_code == 201, created.text
        objects = f"/runs/{run_id}/streams/o/objects"
        intent = (
            await api.post(
                objects,
                json={
                    "idempotency_key": "obj",
                    "size": len(BODY),
                    "sha256": hashlib.sha256(BODY).hexdigest(),
                    "content_type": "application/octet-stream",
                },
            )
        ).json()
        put = await api.put(f"{objects}/{intent['object_id']}/body", content=BODY)
        assert put.status_code == 200, put.text
        assert (await api.post(f"{objects}/{intent['object_id']}/abort")).status_code == 200

        async def queued() -> bool:
            return await count("deletion_outbox", "o") >= 1

        await _until(queued)  # done at the earliest a second before it may go
        await _until(lambda: _none_left(pool, run_id, "deletion_outbox", "o"))
        assert not [p for p in objects_dir.rglob("*") if p.is_file() and run_id in str(p)]

        # The held stream keeps every delivery row and every receipt, long past the ages.
        assert await count("input_deliveries", "held") == 4
        assert await count("append_receipts", "held") == 4
        replay = await api.post(
            f"{held}/records",
            json={"records": [{"data": {"n": 0}}]},
            headers={"Idempotency-Key": "k0"},
        )
        assert replay.status_code == 200 and replay.headers["Idempotent-Replayed"] == "true"

    assert not stray.exists() and young.exists()  # older than the upload age: swept
    rows = await pool.fetch("SELECT name, last_error FROM maintenance_sweeps")
    names = {r["name"] for r in rows}
    assert names >= SWEEPS
    assert any(n.startswith("sweep-abandoned-uploads:") for n in names)
    assert all(r["last_error"] is None for r in rows), rows


async def _none_left(pool: asyncpg.Pool, run_id: str, table: str, stream_id: str) -> bool:
    left = await pool.fetchval(
        f"SELECT count(*) FROM {table} WHERE run_id = $1 AND stream_id = $2", run_id, stream_id
    )
    return left == 0


@pytest.fixture
async def own_database(postgres_admin_url: str) -> AsyncIterator[tuple[str, asyncpg.Pool]]:
    url, name = await create_test_database(postgres_admin_url)
    pool = await asyncpg.create_pool(url, min_size=1, max_size=3)
    try:
        yield url, pool
    finally:
        await pool.close()
        await drop_test_database(postgres_admin_url, name)


def _worker_id(process: WorkerProcess) -> str:
    found = re.search(r"workers running \(worker id ([^)]+)\)", process.log())
    assert found, process.log()
    return found.group(1)


LEASE = 1.0


async def test_a_sweep_held_by_a_killed_worker_is_taken_over_once_its_lease_runs_out(
    own_database: tuple[str, asyncpg.Pool], tmp_path: Path
) -> None:
    url, pool = own_database
    env = {
        "DUCTOR_STREAMS_WORKER_LEASE_SECONDS": str(LEASE),
        "DUCTOR_STREAMS_CLEANUP_INTERVAL_SECONDS": "3600",
        # The tick waits on the lock for as long as the test holds it (a second worker starting
        # and three leases): longer than the 5 s a wait on PostgreSQL is bounded by at first,
        # after which the tick fails and gives the sweep back.
        "DUCTOR_STREAMS_STATEMENT_TIMEOUT_SECONDS": "60",
        "DUCTOR_STREAMS_REQUEST_TIMEOUT_SECONDS": "60",
    }
    sweep = "forget-gap-evidence"

    async def row() -> asyncpg.Record:
        return await pool.fetchrow(
            "SELECT claimed_by, lease_until, next_attempt_at, attempts, now() AS now "
            "FROM maintenance_sweeps WHERE name = $1",
            sweep,
        )

    first = WorkerProcess(database_url=url, data_dir=tmp_path / "a", env=env)
    second = WorkerProcess(database_url=url, data_dir=tmp_path / "b", env=env)
    try:
        # The table the sweep deletes from is locked: the first worker's tick waits in its DELETE,
        # holding (and renewing) the sweep's lease all along.
        async with pool.acquire() as locker:
            blocking = locker.transaction()
            await blocking.start()
            await locker.execute("LOCK TABLE gap_evidence IN ACCESS EXCLUSIVE MODE")
            try:
                await asyncio.to_thread(first.start)
                holder = _worker_id(first)

                async def claimed_by_first() -> bool:
                    found = await row()
                    return found is not None and found["claimed_by"] == holder

                await _until(claimed_by_first)
                await asyncio.to_thread(second.start)
                for _ in range(3):  # three leases: renewed, so the live second worker keeps off
                    await asyncio.sleep(LEASE)
                    found = await row()
                    assert found["claimed_by"] == holder and found["lease_until"] > found["now"], (
                        dict(found),
                        first.log()[-4000:],
                    )
                first.kill()
            finally:
                await blocking.rollback()

            async def taken_over() -> bool:
                found = await row()
                return (
                    found["claimed_by"] is None
                    and (found["next_attempt_at"] - found["now"]).total_seconds() > 3000
                )

            await _until(taken_over)  # run by the second worker, due again in an hour
    finally:
        await asyncio.to_thread(first.kill)
        await asyncio.to_thread(second.stop)
    assert (await row())["attempts"] == 0
