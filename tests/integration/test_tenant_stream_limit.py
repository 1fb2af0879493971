"""A tenant's limit on the streams it holds (DUCTOR_STREAMS_MAX_STREAMS_PER_TENANT), on real
PostgreSQL and a real server: the count every way of creating and erasing streams keeps
(migration 0505's triggers), its fold, and the 409 past the limit on both surfaces."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator

import asyncpg
import httpx
import pytest

from adapters.postgres.tenant_counts import fold_tenant_counts, tenant_streams
from tests.conftest import SERVER_ENV, Tokens
from tests.support.server import ServerProcess

LIMIT = 5
DS = "/api/durable-streams/v1/stream"


@pytest.fixture(scope="module")
def limited(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server whose tenants may hold 5 streams each."""
    process = ServerProcess(
        database_url=database_url,
        data_dir=tmp_path_factory.mktemp("limited"),
        env={**SERVER_ENV, "DUCTOR_STREAMS_MAX_STREAMS_PER_TENANT": str(LIMIT)},
    ).start()
    yield process
    process.stop()


@pytest.fixture
async def api(limited: ServerProcess, tokens: Tokens) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the limited server, for a tenant of its own."""
    async with await tokens.client(limited, "t-" + secrets.token_hex(5)) as client:
        yield client


async def native_create(client: httpx.AsyncClient, run: str, stream: str) -> httpx.Response:
    return await client.post(
        f"/api/workflow-streams/runs/{run}/streams",
        json={"stream_id": stream, "direction": "output"},
    )


async def counted(pool: asyncpg.Pool, tenant: str) -> tuple[int, int]:
    """The tenant's count as the triggers keep it, and its rows in `streams`."""
    actual = await pool.fetchval("SELECT count(*) FROM streams WHERE tenant = $1", tenant)
    return await tenant_streams(pool, tenant), actual


async def test_every_way_of_creating_and_erasing_streams_is_counted(
    server: ServerProcess, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    tenant = "t-" + secrets.token_hex(5)
    async with await tokens.client(server, tenant) as api:
        # Creations together (many at once), one again (not created twice), one with records.
        made = await asyncio.gather(*(native_create(api, "r1", f"s{i}") for i in range(20)))
        assert [r.status_code for r in made] == [201] * 20
        assert (await native_create(api, "r1", "s0")).status_code == 200
        answer = await api.put(
            f"{DS}/r2/ds", content=b'[{"a":1}]', headers={"Content-Type": "application/json"}
        )
        assert answer.status_code == 201, answer.text
        assert await counted(pool, tenant) == (21, 21)

        # A fork, its source deleted (kept, soft-deleted, while the fork reads it), then the
        # fork: both go.
        answer = await api.put(
            f"{DS}/r2/fork",
            headers={"Stream-Forked-From": "/v1/stream/r2/ds", "Content-Type": "application/json"},
        )
        assert answer.status_code == 201, answer.text
        assert await counted(pool, tenant) == (22, 22)
        assert (await api.delete(f"{DS}/r2/ds")).status_code == 204
        assert await counted(pool, tenant) == (22, 22)
        assert (await api.delete(f"{DS}/r2/fork")).status_code == 204
        assert await counted(pool, tenant) == (20, 20)

        # A stream deleted alone, and a whole run.
        gone = await api.delete("/api/workflow-streams/runs/r1/streams/s19")
        assert gone.status_code == 204, gone.text
        assert await counted(pool, tenant) == (19, 19)
        gone = await api.delete("/api/workflow-streams/runs/r1")
        assert gone.status_code == 204, gone.text
        assert await counted(pool, tenant) == (0, 0)


async def test_a_transaction_rolled_back_leaves_the_count_as_it_was(pool: asyncpg.Pool) -> None:
    tenant = "t-" + secrets.token_hex(5)
    async with pool.acquire() as conn:
        transaction = conn.transaction()
        await transaction.start()
        await conn.execute(
            "INSERT INTO streams (tenant, run_id, stream_id, definition, created_at, version, "
            "state) VALUES ($1, 'r', 's', '\\x00', now(), 1, '\\x00')",
            tenant,
        )
        assert await tenant_streams(conn, tenant) == 1  # its own transaction sees it
        await transaction.rollback()
    assert await tenant_streams(pool, tenant) == 0


async def test_the_fold_sums_the_rows_of_ended_backends_and_keeps_the_count(
    database_url: str, pool: asyncpg.Pool
) -> None:
    tenant = "t-" + secrets.token_hex(5)
    insert = (
        "INSERT INTO streams (tenant, run_id, stream_id, definition, created_at, version, "
        "state) VALUES ($1, $2, $3, '\\x00', now(), 1, '\\x00')"
    )
    # Three connections (three backends) create streams, one of them stays open.
    staying = await asyncpg.connect(database_url)
    try:
        for n, conn in enumerate([staying, *[await asyncpg.connect(database_url) for _ in (1, 2)]]):
            for i in range(3):
                await conn.execute(insert, tenant, f"r{n}", f"s{i}")
            if conn is not staying:
                await conn.close()
        rows = "SELECT count(*) FROM tenant_stream_counts WHERE tenant = $1"
        # Three rows, or fewer if the server's own sweep folded meanwhile: the sum holds.
        assert 2 <= await pool.fetchval(rows, tenant) <= 3
        assert await tenant_streams(pool, tenant) == 9
        for _ in range(50):  # a closed connection's backend ends a moment after
            await fold_tenant_counts(pool)
            if await pool.fetchval(rows, tenant) == 2:
                break
            await asyncio.sleep(0.1)
        # The two ended backends' rows are one (backend 0's); the open one's is its own.
        assert await pool.fetchval(rows, tenant) == 2
        assert await tenant_streams(pool, tenant) == 9
        await staying.execute("DELETE FROM streams WHERE tenant = $1", tenant)
        assert await tenant_streams(pool, tenant) == 0
    finally:
        await staying.close()
    for _ in range(50):
        await fold_tenant_counts(pool)
        if not await pool.fetchval(rows, tenant):
            break
        await asyncio.sleep(0.1)
    # Nothing is left of a tenant with no streams once its backends have ended.
    assert await pool.fetchval(rows, tenant) == 0
    assert await tenant_streams(pool, tenant) == 0


async def test_the_fold_passes_over_a_row_a_transaction_holds(pool: asyncpg.Pool) -> None:
    """A row whose backend the fold takes for ended, but that a transaction holds (a backend
    that took that pid since), is left for the next fold, not waited for."""
    tenant = "t-" + secrets.token_hex(5)
    gone_pid = 2**31 - 7  # no backend has it
    await pool.execute(
        "INSERT INTO tenant_stream_counts (tenant, backend, streams) VALUES ($1, $2, 4)",
        tenant,
        gone_pid,
    )
    async with pool.acquire() as holder, holder.transaction():
        await holder.execute(
            "UPDATE tenant_stream_counts SET streams = streams + 1 "
            "WHERE tenant = $1 AND backend = $2",
            tenant,
            gone_pid,
        )
        async with pool.acquire() as folder:
            await folder.execute("SET lock_timeout = 2000")  # a wait would fail the fold
            await fold_tenant_counts(folder)
            await folder.execute("RESET lock_timeout")
    backends = await pool.fetch(
        "SELECT backend, streams FROM tenant_stream_counts WHERE tenant = $1", tenant
    )
    assert [tuple(r) for r in backends] == [(gone_pid, 5)]
    await fold_tenant_counts(pool)  # once let go, it is folded
    backends = await pool.fetch(
        "SELECT backend, streams FROM tenant_stream_counts WHERE tenant = $1", tenant
    )
    assert [tuple(r) for r in backends] == [(0, 5)]
    await pool.execute("DELETE FROM tenant_stream_counts WHERE tenant = $1", tenant)


async def test_writers_at_once_on_two_pools_keep_the_count_exact(
    database_url: str, pool: asyncpg.Pool
) -> None:
    """Creations and erasures of one tenant on many connections at once (two processes'
    pools): no transaction waits on another for the count, and it stays exact."""
    tenant = "t-" + secrets.token_hex(5)
    insert = (
        "INSERT INTO streams (tenant, run_id, stream_id, definition, created_at, version, "
        "state) SELECT $1, $2, 's' || i, '\\x00', now(), 1, '\\x00' FROM generate_series(1, $3) i"
    )
    pools = [await asyncpg.create_pool(database_url, min_size=4, max_size=4) for _ in (1, 2)]
    try:

        async def writer(p: asyncpg.Pool, w: int) -> None:
            for n in range(10):
                run = f"w{w}-{n}"
                async with p.acquire() as conn, conn.transaction():
                    # A wait on another transaction's row would end it: there is none to wait on.
                    await conn.execute("SET LOCAL lock_timeout = 1")
                    await conn.execute(insert, tenant, run, 5)
                if n % 2:
                    await p.execute(
                        "DELETE FROM streams WHERE tenant = $1 AND run_id = $2", tenant, run
                    )

        await asyncio.gather(*(writer(pools[w % 2], w) for w in range(8)))
    finally:
        for p in pools:
            await p.close()
    assert await counted(pool, tenant) == (200, 200)


async def test_past_its_limit_a_tenant_creates_nothing_and_the_others_are_served(
    limited: ServerProcess, tokens: Tokens, api: httpx.AsyncClient
) -> None:
    for i in range(LIMIT):
        assert (await native_create(api, "run", f"s{i}")).status_code == 201
    refused = await native_create(api, "run", "one-more")
    assert refused.status_code == 409, refused.text
    assert refused.headers["content-type"].startswith("application/problem+json")
    problem = refused.json()
    assert problem["code"] == "quota-exhausted"
    assert problem["limit"] == LIMIT
    missing = await api.get("/api/workflow-streams/runs/run/streams/one-more")
    assert missing.status_code == 404
    # The Durable Streams surface refuses the same, with its records: nothing is created.
    refused = await api.put(
        f"{DS}/run/ds", content=b'[{"a":1}]', headers={"Content-Type": "application/json"}
    )
    assert refused.status_code == 409, refused.text
    assert (await api.head(f"{DS}/run/ds")).status_code == 404
    # A stream already there is answered as before, limit or not.
    assert (await native_create(api, "run", "s0")).status_code == 200
    # Another tenant is not held by it.
    async with await tokens.client(limited, "t-" + secrets.token_hex(5)) as other:
        assert (await native_create(other, "run", "s0")).status_code == 201
    # Once one is deleted, the tenant may create one again (counted within a second).
    assert (await api.delete("/api/workflow-streams/runs/run/streams/s1")).status_code == 204
    for _ in range(40):
        again = await native_create(api, "run", "one-more")
        if again.status_code != 409:
            break
        await asyncio.sleep(0.1)
    assert again.status_code == 201, again.text
    assert (await native_create(api, "run", "and-another")).status_code == 409


async def test_a_deletion_gives_its_room_back_at_once(api: httpx.AsyncClient) -> None:
    """A tenant at its limit deletes a stream and creates another, many times in a row, on both
    surfaces and by run: every creation is 201 (the process counted its own creations and not
    the deletions until its next read of the count, a second later, and refused them)."""
    for i in range(LIMIT):
        assert (await native_create(api, "full", f"s{i}")).status_code == 201
    assert (await native_create(api, "full", "over")).status_code == 409
    for i in range(12):
        deleted = await api.delete(f"/api/workflow-streams/runs/full/streams/s{i}")
        assert deleted.status_code == 204, deleted.text
        made = await native_create(api, "full", f"s{i + LIMIT}")
        assert made.status_code == 201, (i, made.text)
    for i in range(3):
        assert (await api.delete(f"{DS}/full/s{i + 12}")).status_code == 204
        made = await api.put(f"{DS}/full/p{i}", headers={"Content-Type": "text/plain"})
        assert made.status_code == 201, (i, made.text)
    assert (await api.delete("/api/workflow-streams/runs/full")).status_code == 204
    for i in range(LIMIT):
        assert (await native_create(api, "again", f"s{i}")).status_code == 201


async def test_creations_at_once_pass_the_limit_by_no_more_than_the_room_there_was(
    api: httpx.AsyncClient,
) -> None:
    """One stream of room, twenty creations at once on one process: one is made, nineteen are
    409 (each was checked, then counted once made: fifty at once passed a limit of 30 by 38)."""
    for i in range(LIMIT - 1):
        assert (await native_create(api, "busy", f"s{i}")).status_code == 201
    made = await asyncio.gather(*(native_create(api, "busy", f"n{i}") for i in range(20)))
    assert sorted(r.status_code for r in made) == [201] + [409] * 19
    listed = (await api.get("/api/workflow-streams/runs/busy/streams")).json()["streams"]
    assert len(listed) == LIMIT
