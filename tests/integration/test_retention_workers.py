"""Retention through the HTTP API and real worker processes on PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import asyncpg
import httpx
import pytest

from tests.integration.test_durable_streams import ds_client
from tests.support.server import ServerProcess, WorkerProcess

WORKER_ENV = {
    "DUCTOR_STREAMS_WORKER_POLL_SECONDS": "0.1",
    "DUCTOR_STREAMS_PRUNE_INTERVAL_SECONDS": "0.2",
    "DUCTOR_STREAMS_WORKER_LEASE_SECONDS": "2",
    "DUCTOR_STREAMS_LOG_LEVEL": "INFO",
}


@pytest.fixture(scope="module")
def worker(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    process = WorkerProcess(
        database_url=database_url, data_dir=tmp_path_factory.mktemp("worker"), env=WORKER_ENV
    ).start()
    yield process
    process.stop()


async def create(
    api: httpx.AsyncClient, run_id: str, stream_id: str, log_region: str = "local", **retention: int
) -> str:
    answer = await api.post(
        f"/runs/{run_id}/streams",
        json={
            "stream_id": stream_id,
            "direction": "output",
            "retention": retention,
            "placement": {"log_region": log_region},
        },
    )
    assert answer.status_code == 201, answer.text
    return f"/runs/{run_id}/streams/{stream_id}"


async def append(api: httpx.AsyncClient, path: str, count: int) -> None:
    answer = await api.post(
        f"{path}/records", json={"records": [{"data": i} for i in range(count)]}
    )
    assert answer.status_code == 201, answer.text


async def earliest_becomes(api: httpx.AsyncClient, path: str, expected: int) -> dict:
    async with asyncio.timeout(15):
        while True:
            document = (await api.get(path)).json()
            if document["state"]["earliest"] == expected:
                return document
            await asyncio.sleep(0.1)


async def test_max_records_prunes_and_an_old_cursor_is_gone_with_exact_fields(
    api: httpx.AsyncClient, worker: WorkerProcess, run_id: str
) -> None:
    path = await create(api, run_id, "count", log_region="audit-eu", max_records=3)
    await append(api, path, 10)
    await earliest_becomes(api, path, 8)
    gone = await api.get(f"{path}/records", params={"cursor": 2})
    assert gone.status_code == 410
    body = gone.json()
    assert body["code"] == "cursor-expired"
    assert (body["requested"], body["earliest"], body["latest"], body["reason"]) == (
        3,
        8,
        10,
        "retention",
    )
    page = (await api.get(f"{path}/records", params={"cursor": 7})).json()
    assert [r["data"] for r in page["records"]] == [7, 8, 9]
    lines = [json.loads(line) for line in worker.log().splitlines() if line.startswith("{")]
    pruned = [x for x in lines if x.get("run_id") == run_id and "pruned" in x["msg"]]
    assert pruned and all(x["log_region"] == "audit-eu" for x in pruned)
    assert pruned[0]["stream_id"] == "count" and pruned[0]["tenant"] == "default"


async def test_max_age_prunes_what_is_older(
    api: httpx.AsyncClient, worker: WorkerProcess, run_id: str
) -> None:
    path = await create(api, run_id, "age", max_age_seconds=1)
    await append(api, path, 5)
    document = await earliest_becomes(api, path, 6)
    assert document["state"]["head"] == 5
    assert (await api.get(f"{path}/records", params={"cursor": 0})).status_code == 410
    assert (await api.get(f"{path}/records", params={"cursor": 5})).status_code == 200


async def test_a_legal_hold_stops_pruning_and_lifting_it_resumes(
    api: httpx.AsyncClient, worker: WorkerProcess, run_id: str
) -> None:
    path = await create(api, run_id, "held", max_records=2)
    hold = await api.put(f"{path}/legal-hold", json={"enabled": True, "reason": "litigation"})
    assert hold.status_code == 200 and hold.json()["enabled"] is True
    await append(api, path, 6)
    await asyncio.sleep(1.5)  # several prune intervals
    document = (await api.get(path)).json()
    assert document["state"]["earliest"] == 1
    assert (await api.get(f"{path}/records", params={"cursor": 0})).status_code == 200
    await api.put(f"{path}/legal-hold", json={"enabled": False})
    await earliest_becomes(api, path, 5)


async def test_retention_keeps_what_a_fork_inherits_even_when_the_fork_is_held(
    api: httpx.AsyncClient, server: ServerProcess, worker: WorkerProcess, run_id: str
) -> None:
    path = await create(api, run_id, "src", max_records=1)
    # Held while the fork is made, so that the worker cannot prune before the fork exists.
    assert (await api.put(f"{path}/legal-hold", json={"enabled": True})).status_code == 200
    await append(api, path, 2)
    fork = f"/{run_id}/fk"
    async with ds_client(server) as ds:
        forked = await ds.put(
            fork,
            headers={
                "Stream-Forked-From": f"/v1/stream/{run_id}/src",
                "Stream-Fork-Offset": "0000000000000000_0000000000000002",
            },
        )
        assert forked.status_code == 201, forked.text
        hold = await api.put(
            f"/runs/{run_id}/streams/fk/legal-hold", json={"enabled": True, "reason": "case"}
        )
        assert hold.status_code == 200
        assert (await api.put(f"{path}/legal-hold", json={"enabled": False})).status_code == 200
        await append(api, path, 2)
        await asyncio.sleep(1.5)  # several prune intervals
        read = await ds.get(fork, params={"offset": "-1"})
        assert read.status_code == 200, read.text
        assert read.json() == [0, 1]
        assert (await api.get(path)).json()["state"]["earliest"] == 1  # the fork pins 1..2
        page = (await api.get(f"{path}/records", params={"cursor": 0})).json()
        assert [r["data"] for r in page["records"]] == [0, 1, 0, 1]
        lifted = await api.put(f"/runs/{run_id}/streams/fk/legal-hold", json={"enabled": False})
        assert lifted.status_code == 200
        assert (await ds.delete(fork)).status_code == 204
    await earliest_becomes(api, path, 4)  # its last fork gone, retention goes on


@pytest.mark.slow
async def test_a_killed_worker_s_claims_are_taken_over_after_the_lease(
    api: httpx.AsyncClient,
    pool: asyncpg.Pool,
    database_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    run_id: str,
) -> None:
    paths = [await create(api, run_id, f"s{i}", max_records=1) for i in range(100)]
    for path in paths:
        await append(api, path, 5)
    # A worker that claimed every job and died without a word: its lease must run out first.
    await pool.execute(
        "UPDATE retention_jobs SET claimed_by = 'dead-worker', lease_until = now() + interval '2s' "
        "WHERE run_id = $1",
        run_id,
    )
    first = WorkerProcess(
        database_url=database_url, data_dir=tmp_path_factory.mktemp("w1"), env=WORKER_ENV
    ).start()
    async with asyncio.timeout(15):  # once the dead lease runs out, the first worker claims
        while not await pool.fetchval(
            "SELECT count(*) FROM retention_jobs WHERE run_id = $1 "
            "AND claimed_by IS NOT NULL AND claimed_by <> 'dead-worker'",
            run_id,
        ):
            await asyncio.sleep(0.01)
    first.kill()  # kill -9 while it holds claims
    second = WorkerProcess(
        database_url=database_url, data_dir=tmp_path_factory.mktemp("w2"), env=WORKER_ENV
    ).start()
    try:
        for path in paths:
            await earliest_becomes(api, path, 5)
    finally:
        second.stop()
    pruned = await pool.fetch(
        "SELECT stream_id, count(*) FROM stream_events WHERE run_id = $1 "
        "AND type = 'records_pruned' GROUP BY stream_id",
        run_id,
    )
    assert sorted(n for _, n in pruned) == [1] * 100  # done once in effect
    left = await pool.fetchval(
        "SELECT count(*) FROM retention_jobs WHERE run_id = $1 AND claimed_by = 'dead-worker'",
        run_id,
    )
    assert left == 0
    records = await pool.fetchval("SELECT count(*) FROM stream_records WHERE run_id = $1", run_id)
    assert records == 100  # one retained record per stream
