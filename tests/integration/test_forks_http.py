"""Forks through the native HTTP API of a real server: a fork (created through the PostgreSQL
port, as the Durable Streams surface creates one) reads its source's prefix stitched to its own
records by GET records, long-poll and subscribe; its source, deleted, answers 410 while the fork
reads on; the fork's deletion takes the source with it."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import asyncpg
import httpx
import msgspec
from httpx_sse import aconnect_sse

from adapters.postgres.streams import PostgresStreams
from domain.definition import Fork
from domain.stream import StreamKey
from tests.conftest import BOOTSTRAP_TOKEN
from tests.integration.test_http_head import committed_object
from tests.support.server import ServerProcess


async def create(api: httpx.AsyncClient, run_id: str, stream_id: str) -> None:
    response = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": stream_id, "direction": "output"}
    )
    assert response.status_code == 201, response.text


async def append(api: httpx.AsyncClient, run_id: str, stream_id: str, *data: object) -> None:
    response = await api.post(
        f"/runs/{run_id}/streams/{stream_id}/records",
        json={"records": [{"data": d} for d in data]},
    )
    assert response.status_code == 201, response.text


async def fork(pool: asyncpg.Pool, run_id: str, source_id: str, stream_id: str, through: int):
    repo = PostgresStreams(pool)
    tenant = await pool.fetchval(
        "SELECT tenant FROM streams WHERE run_id = $1 AND stream_id = $2", run_id, source_id
    )
    source = await repo.load(StreamKey(tenant, run_id, source_id))
    assert source is not None
    link = Fork(
        run_id=run_id,
        stream_id=source_id,
        source_created_at=source.state.created_at,
        through=through,
        offset=through,
    )
    definition = msgspec.structs.replace(
        source.definition, stream_id=stream_id, fork=link, content_type="application/json"
    )
    _, created = await repo.create(
        StreamKey(tenant, run_id, stream_id), definition, datetime.now(UTC)
    )
    assert created


async def sse_data(api: httpx.AsyncClient, url: str, count: int) -> list[object]:
    """The `data` of the first `count` records a subscription delivers."""
    seen: list[object] = []
    async with asyncio.timeout(15), aconnect_sse(api, "GET", url) as source:
        assert source.response.status_code == 200
        async for event in source.aiter_sse():
            if event.event == "record":
                seen.append(json.loads(event.data)["data"])
                if len(seen) == count:
                    return seen
    return seen


async def test_a_fork_reads_stitched_and_its_deleted_source_answers_410(
    api: httpx.AsyncClient, pool: asyncpg.Pool, run_id: str
) -> None:
    await create(api, run_id, "src")
    await append(api, run_id, "src", 1, 2, 3)
    await fork(pool, run_id, "src", "f", 2)
    await append(api, run_id, "f", 30)
    await append(api, run_id, "src", 4)  # after the fork point: never in the fork
    base = f"/runs/{run_id}/streams"
    keyed = await api.post(
        f"{base}/src/records", json={"records": [{"data": 8}]}, headers={"Idempotency-Key": "k"}
    )
    assert keyed.status_code == 201, keyed.text

    page = (await api.get(f"{base}/f/records?cursor=0")).json()
    assert [r["data"] for r in page["records"]] == [1, 2, 30]
    assert [r["sequence"] for r in page["records"]] == [1, 2, 3]
    assert (page["head"], page["earliest"]) == (3, 1)
    page = (await api.get(f"{base}/f/records?cursor=1&limit=1")).json()
    assert [r["data"] for r in page["records"]] == [2]
    assert await sse_data(api, f"{base}/f/subscribe?cursor=0", 3) == [1, 2, 30]

    # A long-poll at the fork's head wakes for the fork's append, not for the source's.
    waiting = asyncio.create_task(api.get(f"{base}/f/records?cursor=3&wait=10"))
    await asyncio.sleep(0.3)
    await append(api, run_id, "src", 5)
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await append(api, run_id, "f", 40)
    page = (await waiting).json()
    assert [r["data"] for r in page["records"]] == [40]

    assert (await api.delete(f"{base}/src")).status_code == 204
    for response in (
        await api.get(f"{base}/src"),
        await api.get(f"{base}/src/records?cursor=0"),
        await api.post(f"{base}/src/records", json={"records": [{"data": 9}]}),
        # the retry of an append it stored too: its receipt is kept until it is erased
        await api.post(
            f"{base}/src/records",
            json={"records": [{"data": 8}]},
            headers={"Idempotency-Key": "k"},
        ),
        await api.post(f"{base}/src/close"),
        await api.delete(f"{base}/src"),
    ):
        assert response.status_code == 410, response.text
        assert response.json()["code"] == "stream-gone"
    again = await api.post(f"{base}", json={"stream_id": "src", "direction": "output"})
    assert again.status_code == 409, again.text
    page = (await api.get(f"{base}/f/records?cursor=0")).json()
    assert [r["data"] for r in page["records"]] == [1, 2, 30, 40]
    assert await sse_data(api, f"{base}/f/subscribe?cursor=1", 3) == [2, 30, 40]

    assert (await api.delete(f"{base}/f")).status_code == 204
    assert (await api.get(f"{base}/src")).status_code == 404  # released with its last fork
    await create(api, run_id, "src")


async def test_a_forks_readers_fetch_the_objects_it_inherits_and_a_deleted_source_serves_none(
    api: httpx.AsyncClient, pool: asyncpg.Pool, run_id: str
) -> None:
    """A fork's readers got 404 for the bodies of the object records they read (on the fork's
    path), and the source, deleted while the fork read it, answered 410 to its records but still
    served every object, one committed after the fork point included, which no fork inherits."""
    await create(api, run_id, "osrc")
    source = f"/runs/{run_id}/streams/osrc"
    inherited = await committed_object(api, source, b"before the fork point")  # record 1
    await fork(pool, run_id, "osrc", "ofork", 1)
    after = await committed_object(api, source, b"after the fork point", key="k2")  # record 2
    on_fork = f"/runs/{run_id}/streams/ofork/objects"
    inherited_id, after_id = inherited.rsplit("/", 1)[1], after.rsplit("/", 1)[1]
    for deleted in (False, True):
        if deleted:
            assert (await api.delete(f"/runs/{run_id}/streams/osrc")).status_code == 204
        body = await api.get(f"{on_fork}/{inherited_id}/body")
        assert body.status_code == 200 and body.content == b"before the fork point", body.text
        assert (await api.get(f"{on_fork}/{inherited_id}")).json()["state"] == "committed"
        for path in (f"{on_fork}/{after_id}", f"{on_fork}/{after_id}/body"):
            assert (await api.get(path)).status_code == 404
    for response in (
        await api.get(after),
        await api.get(f"{after}/body"),
        await api.head(f"{after}/body"),
        await api.get(f"{inherited}/body"),
    ):
        assert response.status_code == 410, (response.request.url, response.text)
    assert (await api.get(after)).json()["code"] == "stream-gone"


async def test_a_long_poll_on_a_source_deleted_while_it_waits_answers_410(
    api: httpx.AsyncClient, pool: asyncpg.Pool, server: ServerProcess, run_id: str
) -> None:
    """Deleted while its fork reads it, the source answers 410 to a long-poll waiting on it
    then, as to the next read (a waiting long-poll answered 404)."""
    await create(api, run_id, "src")
    await append(api, run_id, "src", 1)
    await fork(pool, run_id, "src", "f", 1)
    async with httpx.AsyncClient(
        base_url=f"{server.base_url}/api/durable-streams/v1/stream",
        headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"},
        timeout=30,
    ) as ds:
        tail = (await ds.head(f"/{run_id}/src")).headers["stream-next-offset"]
        waiting = asyncio.create_task(
            ds.get(f"/{run_id}/src", params={"offset": tail, "live": "long-poll"})
        )
        await asyncio.sleep(0.3)
        assert (await api.delete(f"/runs/{run_id}/streams/src")).status_code == 204
        answer = await waiting
        assert answer.status_code == 410, answer.text
        assert answer.json()["code"] == "stream-gone"
