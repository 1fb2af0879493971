"""Input streams end to end: records reach the workflow wait service once each, in order."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import asyncpg
import httpx
import pytest

from tests.integration.test_durable_streams import ds_client
from tests.support.server import ServerProcess, WorkerProcess
from tests.support.wait_stub import WaitServiceStub

FAST = {
    "DUCTOR_STREAMS_WORKER_POLL_SECONDS": "0.05",
    "DUCTOR_STREAMS_DISPATCH_POLL_SECONDS": "0.05",
    "DUCTOR_STREAMS_WORKER_LEASE_SECONDS": "2",
    "DUCTOR_STREAMS_RETRY_BASE_SECONDS": "0.02",
}


async def input_stream(api: httpx.AsyncClient, run_id: str, stream_id: str) -> str:
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": stream_id, "direction": "input"}
    )
    assert created.status_code == 201, created.text
    return f"/runs/{run_id}/streams/{stream_id}"


async def append(api: httpx.AsyncClient, path: str, *values: object) -> None:
    answer = await api.post(f"{path}/records", json={"records": [{"data": v} for v in values]})
    assert answer.status_code == 201, answer.text


async def fork_of_in(server: ServerProcess, run_id: str) -> None:
    """A Durable Streams fork (`fork`) of the run's stream `in`: it reads what `in` holds."""
    async with ds_client(server) as ds:
        forked = await ds.put(
            f"/{run_id}/fork",
            headers={
                "Content-Type": "application/json",
                "Stream-Forked-From": f"/v1/stream/{run_id}/in",
            },
        )
        assert forked.status_code == 201, forked.text


@pytest.fixture  # not shared: a live dispatcher would deliver the other tests' records
def dispatcher(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    process = WorkerProcess(
        database_url=database_url, data_dir=tmp_path_factory.mktemp("dispatch"), env=FAST
    ).start()
    yield
    process.stop()


async def test_input_records_land_in_the_wait_events_table_in_order(
    api: httpx.AsyncClient, pool: asyncpg.Pool, dispatcher: None, run_id: str
) -> None:
    path = await input_stream(api, run_id, "answers")
    await append(api, path, {"q": 1}, {"q": 2})
    await append(api, path, {"q": 3})
    async with asyncio.timeout(15):
        while (await api.get(path)).json()["state"]["input_delivery"]["pending"]:
            await asyncio.sleep(0.05)
    rows = await pool.fetch(
        "SELECT event_id, sequence, payload FROM workflow_wait_events WHERE run_id = $1 "
        "ORDER BY sequence",
        run_id,
    )
    assert [r["event_id"] for r in rows] == [f"wds:default:{run_id}:answers:{n}" for n in (1, 2, 3)]
    import json

    payload = json.loads(rows[0]["payload"])
    assert payload["record"]["data"] == {"q": 1} and payload["content_type"] == "application/json"
    state = (await api.get(path)).json()["state"]["input_delivery"]
    assert state == {"delivered_through": 3, "pending": 0, "last_error": None}


async def delivered(api: httpx.AsyncClient, path: str) -> None:
    async with asyncio.timeout(15):
        while (await api.get(path)).json()["state"]["input_delivery"]["pending"]:
            await asyncio.sleep(0.05)


async def test_an_input_streams_ids_hold_no_colon_and_a_stream_created_again_delivers_its_own(
    api: httpx.AsyncClient, pool: asyncpg.Pool, dispatcher: None, run_id: str
) -> None:
    """Its events' ids join its IDs with `:` (wds:<tenant>:<runID>:<streamID>:<sequence>): run
    `R:x`'s stream `s` and run `R`'s stream `x:s` would share them, and a wait service keeps one
    event per id, so an input stream's stream ID (and tenant) with a `:` is refused; its run ID
    may hold one, and an output stream's stream ID too. A stream deleted and created again
    delivers its new records under the old event ids: its old events go with it."""
    refused = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "x:s", "direction": "input"}
    )
    assert refused.status_code == 400, refused.text
    assert refused.json()["code"] == "invalid-input" and "':'" in refused.json()["detail"]
    output = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "x:s", "direction": "output"}
    )
    assert output.status_code == 201, output.text
    await input_stream(api, f"{run_id}:x", "s")  # a run ID may hold ':'
    path = await input_stream(api, run_id, "in")
    await append(api, path, "first")
    await delivered(api, path)
    assert (await api.delete(path)).status_code == 204
    await input_stream(api, run_id, "in")
    await append(api, path, "again")
    await delivered(api, path)
    data = await pool.fetch(
        "SELECT event_id, payload #>> '{record,data}' AS data FROM workflow_wait_events "
        "WHERE run_id = $1",
        run_id,
    )
    assert [(r["event_id"], r["data"]) for r in data] == [(f"wds:default:{run_id}:in:1", "again")]


async def test_a_deleted_input_stream_that_forks_still_read_delivers_nothing_more(
    api: httpx.AsyncClient, pool: asyncpg.Pool, server: ServerProcess, run_id: str
) -> None:
    """Deleted while a fork reads its records, an input stream stays (soft-deleted) for the
    fork's sake: its undelivered records are not its workflow's input any more."""
    path = await input_stream(api, run_id, "in")
    await append(api, path, 1, 2, 3)
    await fork_of_in(server, run_id)
    pending = "SELECT count(*) FROM input_deliveries WHERE run_id = $1 AND stream_id = 'in'"
    assert await pool.fetchval(pending, run_id) == 3  # no dispatcher runs here
    assert (await api.delete(path)).status_code == 204
    assert await pool.fetchval(pending, run_id) == 0
    assert (await api.get(path)).status_code == 410  # gone, while the fork reads on


async def test_a_soft_delete_waits_for_an_input_event_landing_and_one_after_lands_nothing(
    api: httpx.AsyncClient, pool: asyncpg.Pool, server: ServerProcess, run_id: str
) -> None:
    """An input event lands only while its stream is there and not deleted, holding the
    stream's row (FOR KEY SHARE) until it commits. A soft delete (forks still read the stream)
    takes the row FOR UPDATE first: it waits for an event landing, and an event after it lands
    nothing. (Holding only the commit's FOR NO KEY UPDATE, it passed the event by: the event
    landed after the stream was deleted.)"""
    from adapters.wait_service.postgres import _INSERT

    path = await input_stream(api, run_id, "in")
    await append(api, path, 1)
    await fork_of_in(server, run_id)
    created = await pool.fetchval(
        "SELECT created_at FROM streams WHERE run_id = $1 AND stream_id = 'in'", run_id
    )

    def event(sequence: int) -> tuple[object, ...]:
        fields = ("default", run_id, "in", sequence)
        return (f"wds:default:{run_id}:in:{sequence}", *fields, "{}", created)

    async with pool.acquire() as landing:
        transaction = landing.transaction()
        await transaction.start()
        await landing.execute(_INSERT, *event(1))  # landing: the stream's row held
        deleting = asyncio.create_task(api.delete(path))
        await asyncio.sleep(0.5)
        assert not deleting.done()  # the soft delete waits for it
        await transaction.commit()
    assert (await asyncio.wait_for(deleting, 10)).status_code == 204
    await pool.execute(_INSERT, *event(2))  # after the deletion: lands nothing
    landed = await pool.fetch(
        "SELECT sequence FROM workflow_wait_events WHERE run_id = $1 ORDER BY 1", run_id
    )
    assert [r[0] for r in landed] == [1]
    assert (await api.get(path)).status_code == 410


async def test_output_streams_create_no_delivery_rows(
    api: httpx.AsyncClient, pool: asyncpg.Pool, run_id: str
) -> None:
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "o", "direction": "output"}
    )
    assert created.status_code == 201
    await append(api, f"/runs/{run_id}/streams/o", 1, 2, 3)
    assert (
        await pool.fetchval("SELECT count(*) FROM input_deliveries WHERE run_id = $1", run_id) == 0
    )
    assert "input_delivery" not in (await api.get(f"/runs/{run_id}/streams/o")).json()["state"]


@pytest.mark.slow
async def test_a_flaky_http_wait_service_and_a_killed_dispatcher_lose_and_reorder_nothing(
    api: httpx.AsyncClient,
    database_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    run_id: str,
) -> None:
    with WaitServiceStub(fail_every=3, lose_answer_every=5) as stub:
        env = {
            **FAST,
            "DUCTOR_STREAMS_WAIT_SERVICE": "http",
            "DUCTOR_STREAMS_WAIT_SERVICE_URL": stub.url,
        }
        workers = [
            WorkerProcess(
                database_url=database_url, data_dir=tmp_path_factory.mktemp(f"d{i}"), env=env
            ).start()
            for i in range(2)
        ]
        try:
            paths = [await input_stream(api, run_id, f"s{i}") for i in range(3)]
            for batch in range(10):
                for path in paths:
                    await append(api, path, *[batch * 10 + i for i in range(5)])
                if batch == 4:
                    workers[0].kill()  # kill -9 mid-delivery; the other takes over
            try:
                async with asyncio.timeout(90):
                    while sum(len(stub.sequences(f"s{i}")) for i in range(3)) < 150:
                        await asyncio.sleep(0.1)
            except TimeoutError:
                counts = [len(stub.sequences(f"s{i}")) for i in range(3)]
                raise AssertionError(
                    f"accepted {counts} of 50 each after 90 s; requests {stub.requests}\n"
                    + workers[1].log()[-3000:]
                ) from None
        finally:
            for w in workers:
                w.stop()
        for i in range(3):
            assert stub.sequences(f"s{i}") == list(range(1, 51))  # each once, in order
        assert stub.duplicates >= 1  # lost answers were published again under the same id
