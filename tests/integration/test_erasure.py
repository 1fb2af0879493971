"""Deletion (erasure) and run listing end to end: real server processes on real PostgreSQL
(docs/http-api.md "Deleting streams and runs", "Listing runs").

Every wait here is bounded, so a deletion that is never heard fails a test instead of hanging it."""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets

import asyncpg
import httpx
import pytest

from adapters.postgres.erasure import ERASED_TABLES
from tests.conftest import BOOTSTRAP_TOKEN, SERVER_ENV, api_client
from tests.integration.test_sse import Subscriber, assert_problem, path, wide_client
from tests.support.server import ServerProcess, WorkerProcess


async def create(api: httpx.AsyncClient, run_id: str, stream_id: str = "s", **extra) -> dict:
    response = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": stream_id, "direction": "output", **extra}
    )
    assert response.status_code == 201, response.text
    return response.json()


async def append(api: httpx.AsyncClient, run_id: str, stream_id: str, *data) -> dict:
    response = await api.post(
        path(run_id, stream_id, "/records"), json={"records": [{"data": d} for d in data]}
    )
    assert response.status_code == 201, response.text
    return response.json()


async def rows_left(pool: asyncpg.Pool, run_id: str) -> dict[str, int]:
    """Rows of the run still in any table a deletion erases (the streams row included)."""
    counts = {}
    for table in (*ERASED_TABLES, "streams"):
        query = f"SELECT count(*) FROM {table} WHERE run_id = $1"
        counts[table] = await pool.fetchval(query, run_id)
    return {table: n for table, n in counts.items() if n}


async def every_route_is_404(api: httpx.AsyncClient, run_id: str, stream_id: str) -> None:
    p = path(run_id, stream_id)
    answers = [
        await api.get(p),
        await api.get(p + "/records"),
        await api.get(p + "/records", params={"wait": 1}),
        await api.get(p + "/subscribe"),
        await api.post(p + "/consumers/c/ack", json={"sequence": 0}),
        await api.post(p + "/records", json={"records": [{"data": 1}]}),
        await api.post(p + "/close"),
        await api.put(p + "/legal-hold", json={"enabled": True, "reason": "late"}),
        await api.post(
            p + "/objects",
            json={"idempotency_key": "k", "size": 1, "sha256": "00" * 32, "content_type": "a/b"},
        ),
        await api.get(p + "/objects/obj-0123"),
        await api.delete(p),
    ]
    for answer in answers:
        assert_problem(answer, 404, "not-found")


async def test_a_stream_deleted_under_concurrent_appends_and_a_subscriber_is_gone_everywhere(
    api: httpx.AsyncClient, pool: asyncpg.Pool, run_id: str
) -> None:
    await create(api, run_id)
    await append(api, run_id, "s", *range(5))
    await api.post(path(run_id, "s", "/consumers/c/ack"), json={"sequence": 2})
    async with wide_client(api) as client:
        subscriber = Subscriber(client, path(run_id, "s", "/subscribe"))
        assert await subscriber.status() == 200
        await subscriber.until_ids(5)

        async def appender(n: int) -> list[int]:
            statuses = []
            for i in range(400):  # until the delete (which comes within a fraction of that)
                response = await client.post(
                    path(run_id, "s", "/records"),
                    json={"records": [{"data": [n, i]}]},
                    headers={"Idempotency-Key": f"{n}-{i}"},
                )
                statuses.append(response.status_code)
                if response.status_code == 404:
                    assert_problem(response, 404, "not-found")
                    break
            return statuses

        appending = [asyncio.create_task(appender(n)) for n in range(12)]
        await asyncio.sleep(0.15)  # appends are in flight
        deleted = await api.delete(path(run_id, "s"))
        assert deleted.status_code == 204, deleted.text
        assert deleted.content == b""
        answers = [await task for task in appending]
        statuses = [s for each in answers for s in each]
        # Each append committed before the delete (and was erased with it) or found no stream;
        # every appender was stopped by a 404.
        assert set(statuses) <= {201, 404}, statuses
        assert 201 in statuses and all(each[-1] == 404 for each in answers)
        await subscriber.until_ended(timeout=10)
        assert subscriber.events[-1].event == "deleted"
        assert subscriber.events[-1].data == "{}"

    assert await rows_left(pool, run_id) == {}
    await every_route_is_404(api, run_id, "s")
    listed = await api.get(f"/runs/{run_id}/streams")
    assert_problem(listed, 404, "not-found")

    # The same ID again: a new stream from sequence 1, whose old receipts are gone too.
    created = await create(api, run_id, limits={"max_unread_items": 7})
    assert created["state"]["head"] == 0 and created["state"]["consumers"] == []
    assert created["limits"]["max_unread_items"] == 7
    first = await client_append(api, run_id, key="0-0")
    assert first.status_code == 201 and first.json()["first_sequence"] == 1
    async with wide_client(api) as client:
        again = Subscriber(client, path(run_id, "s", "/subscribe"))
        await again.until_ids(1)
        assert again.ids == [1]
        await again.disconnect()


async def client_append(api: httpx.AsyncClient, run_id: str, key: str) -> httpx.Response:
    return await api.post(
        path(run_id, "s", "/records"),
        json={"records": [{"data": "again"}]},
        headers={"Idempotency-Key": key},
    )


async def test_a_stream_created_again_never_answers_an_object_id_of_the_deleted_one(
    api: httpx.AsyncClient, run_id: str
) -> None:
    body = b"first body"
    prepare = {
        "idempotency_key": "K",
        "size": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
        "content_type": "application/octet-stream",
    }
    await create(api, run_id, "o")
    first = await api.post(path(run_id, "o", "/objects"), json=prepare)
    assert first.status_code == 201, first.text
    old_id = first.json()["object_id"]
    again = await api.post(path(run_id, "o", "/objects"), json=prepare)
    assert (again.status_code, again.json()["object_id"]) == (200, old_id)  # still idempotent
    old = path(run_id, "o", f"/objects/{old_id}")
    assert (await api.put(old + "/body", content=body)).status_code == 200
    assert (await api.post(old + "/commit")).status_code == 201
    assert (await api.delete(path(run_id, "o"))).status_code == 204
    await create(api, run_id, "o")
    # The same key, even with other fields, is a new intent under a new ID.
    renewed = await api.post(path(run_id, "o", "/objects"), json={**prepare, "size": 7})
    assert renewed.status_code == 201, renewed.text
    assert renewed.json()["object_id"] != old_id
    assert_problem(await api.get(old), 404, "not-found")
    assert_problem(await api.get(old + "/body"), 404, "not-found")


async def test_a_subscriber_on_another_replica_hears_the_deletion(
    api: httpx.AsyncClient, api_b: httpx.AsyncClient, run_id: str
) -> None:
    await create(api, run_id)
    await append(api, run_id, "s", "one")
    assert (await api_b.get(path(run_id, "s", "/records"))).status_code == 200  # B keeps it
    async with wide_client(api_b) as client_b:
        subscriber = Subscriber(client_b, path(run_id, "s", "/subscribe"))
        assert await subscriber.status() == 200
        await subscriber.until_ids(1)
        poll = asyncio.create_task(
            client_b.get(path(run_id, "s", "/records"), params={"cursor": 1, "wait": 20})
        )
        await asyncio.sleep(0.3)
        assert (await api.delete(path(run_id, "s"))).status_code == 204
        await subscriber.until_ended(timeout=10)
        assert subscriber.events[-1].event == "deleted"
        assert_problem(await asyncio.wait_for(poll, 10), 404, "not-found")
    assert_problem(await api_b.get(path(run_id, "s")), 404, "not-found")
    # Created again through A with another definition: B answers by the new one, not the one
    # it kept for the deleted stream.
    await create(api, run_id, authorization={"readers": ["nobody"], "writers": ["*"]})
    assert_problem(await api_b.get(path(run_id, "s", "/records")), 403, "forbidden")
    appended = await api_b.post(path(run_id, "s", "/records"), json={"records": [{"data": 2}]})
    assert appended.status_code == 201 and appended.json()["first_sequence"] == 1


async def test_a_legal_hold_blocks_deleting_the_stream_and_its_run_until_lifted(
    api: httpx.AsyncClient, pool: asyncpg.Pool, run_id: str
) -> None:
    await create(api, run_id, "held")
    await create(api, run_id, "free")
    for stream_id in ("held", "free"):
        await append(api, run_id, stream_id, 1, 2)
    hold = await api.put(path(run_id, "held", "/legal-hold"), json={"enabled": True, "reason": "x"})
    assert hold.status_code == 200
    assert_problem(await api.delete(path(run_id, "held")), 409, "legal-hold-active")
    held = await api.delete(f"/runs/{run_id}")
    assert_problem(held, 409, "legal-hold-active")
    # The run's refusal names the stream that holds it back.
    assert held.json()["stream_id"] == "held" and "'held'" in held.json()["detail"]
    for stream_id in ("held", "free"):  # nothing changed
        records = await api.get(path(run_id, stream_id, "/records"))
        assert [r["data"] for r in records.json()["records"]] == [1, 2]
    lifted = await api.put(path(run_id, "held", "/legal-hold"), json={"enabled": False})
    assert lifted.status_code == 200
    assert (await api.delete(path(run_id, "held"))).status_code == 204
    assert_problem(await api.get(path(run_id, "held")), 404, "not-found")
    assert (await api.get(path(run_id, "free"))).status_code == 200
    await api.put(path(run_id, "free", "/legal-hold"), json={"enabled": True, "reason": "y"})
    assert_problem(await api.delete(f"/runs/{run_id}"), 409, "legal-hold-active")
    await api.put(path(run_id, "free", "/legal-hold"), json={"enabled": False})
    assert (await api.delete(f"/runs/{run_id}")).status_code == 204
    assert await rows_left(pool, run_id) == {}


async def test_a_run_is_deleted_all_or_nothing_within_its_tenant_and_scope(
    api: httpx.AsyncClient, server: ServerProcess, tokens, pool: asyncpg.Pool, run_id: str
) -> None:
    for stream_id in ("a", "b", "c"):
        await create(api, run_id, stream_id)
        await append(api, run_id, stream_id, stream_id)
    assert_problem(await api.delete(f"/runs/run-{secrets.token_hex(4)}"), 404, "not-found")
    assert_problem(await api.delete("/runs/bad!id"), 400, "invalid-input")
    outsider = await tokens.create(tenant="other-" + secrets.token_hex(3))
    writer = await tokens.create(scopes=("streams:read", "streams:write"))
    async with api_client(server, outsider) as other, api_client(server, writer) as plain:
        assert_problem(await other.delete(f"/runs/{run_id}"), 404, "not-found")
        assert_problem(await other.delete(path(run_id, "a")), 404, "not-found")
        assert_problem(await plain.delete(f"/runs/{run_id}"), 403, "forbidden")
        assert_problem(await plain.delete(path(run_id, "a")), 403, "forbidden")
    listed = (await api.get(f"/runs/{run_id}/streams")).json()["streams"]
    assert [s["stream_id"] for s in listed] == ["a", "b", "c"]
    async with wide_client(api) as client:
        subscribers = [Subscriber(client, path(run_id, s, "/subscribe")) for s in "abc"]
        for subscriber in subscribers:
            await subscriber.until_ids(1)
        poll = asyncio.create_task(
            client.get(path(run_id, "b", "/records"), params={"cursor": 1, "wait": 20})
        )
        await asyncio.sleep(0.3)
        assert (await api.delete(f"/runs/{run_id}")).status_code == 204
        assert_problem(await asyncio.wait_for(poll, 10), 404, "not-found")
        for subscriber in subscribers:
            await subscriber.until_ended(timeout=10)
            assert subscriber.events[-1].event == "deleted"
    assert await rows_left(pool, run_id) == {}
    assert_problem(await api.get(f"/runs/{run_id}/streams"), 404, "not-found")
    assert_problem(await api.delete(f"/runs/{run_id}"), 404, "not-found")
    for stream_id in "abc":
        await every_route_is_404(api, run_id, stream_id)


async def test_runs_are_listed_by_pages_within_the_tenant(
    server: ServerProcess, tokens, api: httpx.AsyncClient
) -> None:
    tenant = "lister-" + secrets.token_hex(3)
    token = await tokens.create(tenant=tenant)
    runs = [f"run-{i:02d}" for i in range(5)]
    async with api_client(server, token) as mine:
        assert (await mine.get("/runs")).json() == {"runs": [], "next_after": None}
        for n, run in enumerate(runs):
            for s in range(n % 3 + 1):
                await create(mine, run, f"s{s}")
        await create(api, "run-00", "not-mine")  # the bootstrap tenant's run of the same ID
        await create(api, "run-99-" + secrets.token_hex(2), "not-mine")

        async def page(**params) -> dict:
            response = await mine.get("/runs", params=params)
            assert response.status_code == 200, response.text
            return response.json()

        first = await page(limit=2)
        assert [r["run_id"] for r in first["runs"]] == runs[:2]
        assert [r["stream_count"] for r in first["runs"]] == [1, 2]
        assert first["next_after"] == "run-01"
        assert set(first["runs"][0]) == {"run_id", "stream_count", "created_at"}
        second = await page(limit=2, after=first["next_after"])
        assert [r["run_id"] for r in second["runs"]] == runs[2:4]
        last = await page(limit=2, after=second["next_after"])
        assert [r["run_id"] for r in last["runs"]] == runs[4:]
        assert last["next_after"] is None
        exact = await page(limit=5)
        assert [r["run_id"] for r in exact["runs"]] == runs and exact["next_after"] is None
        short = await page(limit=4)
        assert short["next_after"] == "run-03"
        assert [r["run_id"] for r in (await page())["runs"]] == runs  # default limit 100
        assert (await page(limit=1000))["next_after"] is None
        for bad in (
            {"limit": 0},
            {"limit": 1001},
            {"limit": "x"},
            {"after": "no/such id"},
            {"prefix": "no/such"},
        ):
            assert_problem(await mine.get("/runs", params=bad), 400, "invalid-input")
        by_prefix = await page(prefix="run-0", limit=2, after="run-01")
        assert [r["run_id"] for r in by_prefix["runs"]] == runs[2:4]
        assert by_prefix["next_after"] == "run-03"
        assert [r["run_id"] for r in (await page(prefix="run-04"))["runs"]] == ["run-04"]
        assert (await page(prefix="run-9"))["runs"] == []  # the other tenant's run-99-…
        assert (await mine.delete("/runs/run-02")).status_code == 204
        left = [r["run_id"] for r in (await page())["runs"]]
        assert left == ["run-00", "run-01", "run-03", "run-04"]
    no_read = await tokens.create(tenant=tenant, scopes=("streams:write",))
    async with api_client(server, no_read) as blind:
        assert_problem(await blind.get("/runs"), 403, "forbidden")


# -- object bodies through the deletion workers, across a kill -9 ---------------------------------

BODY = os.urandom(200_000)
WORKER_ENV = {
    "DUCTOR_STREAMS_WORKER_POLL_SECONDS": "0.1",
    "DUCTOR_STREAMS_WORKER_LEASE_SECONDS": "1",
    "DUCTOR_STREAMS_RETRY_BASE_SECONDS": "0.2",
}


def stored_bodies(data_dir, run_id: str) -> list[str]:
    files = (data_dir / "objects").rglob("*")
    return sorted(str(p) for p in files if p.is_file() and run_id in str(p))


@pytest.mark.slow
async def test_the_bodies_of_a_deleted_stream_are_removed_by_workers_across_a_kill_9(
    own_database: str, tmp_path_factory: pytest.TempPathFactory, run_id: str
) -> None:
    data_dir = tmp_path_factory.mktemp("erasure")
    server = ServerProcess(database_url=own_database, data_dir=data_dir, env=SERVER_ENV).start()
    worker = None
    try:
        async with api_client(server, BOOTSTRAP_TOKEN) as api:
            await create(api, run_id, "o")
            sha = hashlib.sha256(BODY).hexdigest()
            for n in range(12):
                prepared = await api.post(
                    path(run_id, "o", "/objects"),
                    json={
                        "idempotency_key": f"k{n}",
                        "size": len(BODY),
                        "sha256": sha,
                        "content_type": "application/octet-stream",
                    },
                )
                object_path = path(run_id, "o", f"/objects/{prepared.json()['object_id']}")
                assert (await api.put(object_path + "/body", content=BODY)).status_code == 200
                if n % 4:  # one in four stays uploaded, never committed
                    assert (await api.post(object_path + "/commit")).status_code == 201
            assert len(stored_bodies(data_dir, run_id)) == 12
            worker = WorkerProcess(database_url=own_database, data_dir=data_dir, env=WORKER_ENV)
            worker.start()
            assert (await api.delete(path(run_id, "o"))).status_code == 204
            # Kill the worker as soon as it has started on the bodies (or, at worst, before).
            async with _connect(own_database) as conn:
                for _ in range(200):
                    claimed = await conn.fetchval(
                        "SELECT count(*) FROM deletion_outbox WHERE run_id = $1 "
                        "AND (claimed_by IS NOT NULL OR done_at IS NOT NULL)",
                        run_id,
                    )
                    if claimed or len(stored_bodies(data_dir, run_id)) < 12:
                        break
                    await asyncio.sleep(0.01)
                worker.kill()
                queued = await conn.fetchval(
                    "SELECT count(*) FROM deletion_outbox WHERE run_id = $1", run_id
                )
                assert queued == 12
                worker = WorkerProcess(
                    database_url=own_database, data_dir=data_dir, env=WORKER_ENV
                ).start()
                async with asyncio.timeout(30):
                    while stored_bodies(data_dir, run_id) or await conn.fetchval(
                        "SELECT count(*) FROM deletion_outbox "
                        "WHERE run_id = $1 AND done_at IS NULL",
                        run_id,
                    ):
                        await asyncio.sleep(0.1)
            # The ID is free again, and its new bodies are not the deleted stream's.
            await create(api, run_id, "o")
            prepared = await api.post(
                path(run_id, "o", "/objects"),
                json={
                    "idempotency_key": "k1",
                    "size": len(BODY),
                    "sha256": sha,
                    "content_type": "application/octet-stream",
                },
            )
            object_path = path(run_id, "o", f"/objects/{prepared.json()['object_id']}")
            assert (await api.put(object_path + "/body", content=BODY)).status_code == 200
            assert (await api.post(object_path + "/commit")).status_code == 201
            await asyncio.sleep(1.0)  # the worker runs meanwhile: nothing of it is due
            assert (await api.get(object_path + "/body")).content == BODY
    finally:
        if worker is not None:
            worker.stop()
        server.stop()


class _connect:
    def __init__(self, url: str) -> None:
        self._url = url

    async def __aenter__(self) -> asyncpg.Connection:
        self._conn = await asyncpg.connect(self._url)
        return self._conn

    async def __aexit__(self, *_: object) -> None:
        await self._conn.close()
