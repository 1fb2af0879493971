"""Input dispatch takes turns across tenants, on real PostgreSQL: one tenant's backlog over many
streams delays another tenant's input by about one job, not by the whole backlog."""

from __future__ import annotations

import asyncio
import secrets
import types

import asyncpg
import httpx
import pytest

from adapters.postgres.deliveries import PostgresInputDeliveries
from application.workers import Job
from tests.conftest import Tokens, api_client
from tests.support.server import ServerProcess, WorkerProcess

BUSY, QUIET, OTHER = "a-busy", "z-quiet", "m-other"  # the busy tenant sorts first


async def backlog(pool: asyncpg.Pool, tenant: str, streams: int, records: int) -> list[str]:
    """`streams` input streams of `tenant`'s with `records` undelivered records each, one
    statement a stream so that their heads wait from distinct instants."""
    names = [f"s{n:03}" for n in range(streams)]
    for name in names:
        await pool.execute(
            "INSERT INTO input_deliveries (tenant, run_id, stream_id, sequence)"
            " SELECT $1, 'r', $2, n FROM generate_series(1, $3) n",
            tenant,
            name,
            records,
        )
    return names


@pytest.fixture
async def empty(own_pool: asyncpg.Pool) -> asyncpg.Pool:
    await own_pool.execute("DELETE FROM input_deliveries")
    return own_pool


def streams_of(jobs: list[Job], tenant: str) -> list[str]:
    return [job.key.stream_id for job in jobs if job.key.tenant == tenant]


async def test_a_claim_gives_every_tenant_a_turn_before_anyone_a_second(
    empty: asyncpg.Pool,
) -> None:
    await backlog(empty, BUSY, 20, 3)
    await backlog(empty, OTHER, 2, 3)
    await backlog(empty, QUIET, 1, 1)
    jobs = await PostgresInputDeliveries(empty, "w").claim(4)
    # Key order alone would give the busy tenant all four.
    assert streams_of(jobs, QUIET) == ["s000"]
    assert streams_of(jobs, OTHER) == ["s000"]  # its second turn is the busy one's too
    assert len(streams_of(jobs, BUSY)) == 2


async def test_streams_a_tenant_already_holds_count_as_its_turns(empty: asyncpg.Pool) -> None:
    await backlog(empty, BUSY, 10, 3)
    held = await PostgresInputDeliveries(empty, "first").claim(5)
    assert streams_of(held, BUSY) == ["s000", "s001", "s002", "s003", "s004"]
    await backlog(empty, QUIET, 1, 1)  # waits from later than every busy stream
    jobs = await PostgresInputDeliveries(empty, "second").claim(1)
    assert [(job.key.tenant, job.key.stream_id) for job in jobs] == [(QUIET, "s000")]


async def test_a_stream_handed_back_after_its_batch_goes_to_the_back_of_its_tenants_turns(
    empty: asyncpg.Pool,
) -> None:
    await backlog(empty, BUSY, 3, 5)
    deliveries = PostgresInputDeliveries(empty, "w")
    [first] = await deliveries.claim(1)
    assert first.key.stream_id == "s000"
    following = await deliveries.advance(first)  # delivered 1, claimed 2
    assert following is not None and following.id == 2
    await deliveries.done(following, None)  # delivered 2: the batch ended with 3 to go
    claimed = await deliveries.claim(3)
    assert [job.key.stream_id for job in claimed] == ["s001", "s002", "s000"]
    assert claimed[-1].id == 3


async def test_a_claim_ranks_a_window_of_heads_that_goes_round_every_stream(
    empty: asyncpg.Pool,
) -> None:
    """A claim ranks at most `window` streams' heads, from after the last window it looked at:
    its cost does not grow with every stream's backlog, and every stream comes into a window."""
    await backlog(empty, BUSY, 10, 3)
    await backlog(empty, QUIET, 1, 1)  # sorts after every busy stream
    deliveries = PostgresInputDeliveries(empty, "w", window=4)
    claims = [await deliveries.claim(1) for _ in range(11)]
    assert all(len(jobs) == 1 for jobs in claims)
    order = [(jobs[0].key.tenant, jobs[0].key.stream_id) for jobs in claims]
    # Windows: s000-s003, s004-s007, then s008, s009, the quiet stream and s000 again.
    assert order[:3] == [(BUSY, "s000"), (BUSY, "s004"), (QUIET, "s000")]
    assert sorted(order) == sorted({*order})  # each stream once: they are all held now
    assert await deliveries.claim(1) == []  # every head held


async def test_a_claim_that_finds_every_head_held_looks_round_once(empty: asyncpg.Pool) -> None:
    """Windows go on while they give too few due streams, but not past where the claim
    started: with every head held, a claim ranks each once, not once per window it may try."""
    await backlog(empty, BUSY, 6, 2)
    holder = PostgresInputDeliveries(empty, "holder")
    assert len(await holder.claim(6)) == 6
    statements = 0
    fetch = empty.fetch

    async def counting(query: str, *args: object) -> list[asyncpg.Record]:
        nonlocal statements
        statements += 1
        return await fetch(query, *args)

    deliveries = PostgresInputDeliveries(empty, "w", window=4)
    deliveries._pool = types.SimpleNamespace(fetch=counting)  # type: ignore[assignment]
    assert await deliveries.claim(1) == []
    assert statements == 2  # s000-s003, then s004, s005 and round to s000-s001: wrapped


async def test_another_tenants_input_is_delivered_while_a_wide_backlog_drains(
    own_database: str, own_pool: asyncpg.Pool, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Through the real server and worker: the busy tenant (whose name sorts first) has 24
    input streams of 400 records; the quiet tenant's one record, appended after them, is
    delivered while most of that backlog still waits. Before turns, the dispatcher took the first
    due streams in key order and the quiet record waited for the whole backlog."""
    await own_pool.execute("DELETE FROM input_deliveries")
    tokens = Tokens(own_pool)
    busy_token = await tokens.create(tenant=BUSY)
    quiet_token = await tokens.create(tenant=QUIET)
    server = ServerProcess(
        database_url=own_database, data_dir=tmp_path_factory.mktemp("turns-server")
    ).start()
    worker = None
    try:
        run_id = "run-" + secrets.token_hex(4)
        streams, records = 24, 400
        async with api_client(server, busy_token) as busy, api_client(server, quiet_token) as quiet:
            for n in range(streams):
                await create_input(busy, run_id, f"in{n}")
            await create_input(quiet, run_id, "in")
            for n in range(streams):
                answer = await busy.post(
                    f"/runs/{run_id}/streams/in{n}/records",
                    json={"records": [{"data": i} for i in range(records)]},
                )
                assert answer.status_code == 201, answer.text
            answer = await quiet.post(
                f"/runs/{run_id}/streams/in/records", json={"records": [{"data": "now"}]}
            )
            assert answer.status_code == 201, answer.text
            worker = WorkerProcess(
                database_url=own_database,
                data_dir=tmp_path_factory.mktemp("turns-worker"),
                env={"DUCTOR_STREAMS_DISPATCH_POLL_SECONDS": "0.05"},
            ).start()
            path = f"/runs/{run_id}/streams/in"
            async with asyncio.timeout(60):
                while (await quiet.get(path)).json()["state"]["input_delivery"]["pending"]:
                    await asyncio.sleep(0.02)
            waiting = await own_pool.fetchval(
                "SELECT count(*) FROM input_deliveries WHERE tenant = $1 AND delivered_at IS NULL",
                BUSY,
            )
        # A dispatcher runs 8 streams at a time, up to 200 records each before it claims again:
        # the quiet record waited for at most one such round, 1,600 of the 9,600.
        assert waiting >= streams * records - 2 * 8 * 200, waiting
    finally:
        if worker is not None:
            worker.stop()
        server.stop()


async def create_input(api: httpx.AsyncClient, run_id: str, stream_id: str) -> None:
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": stream_id, "direction": "input"}
    )
    assert created.status_code == 201, created.text
