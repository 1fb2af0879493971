"""Each tenant's turns at work in a server process, against a real server: past its turns, a
tenant's next request waits for one of its own, while another tenant is served at once; a
request waiting for a live event holds no turn. (The 429 when a request's budget runs out
waiting, and the turn given back as an answer starts or taken once a body is in:
tests/unit/test_turns_gate.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import asyncpg
import httpx
import pytest

from tests.conftest import SERVER_ENV, Tokens
from tests.integration.test_tenant_bodies import new_stream
from tests.support.pull_wake import claimed_pull_wake
from tests.support.server import ServerProcess

TURNS = 2
BUDGET_SECONDS = 4


@contextlib.contextmanager
def turns_server(
    database_url: str, tmp_path_factory: pytest.TempPathFactory, name: str, **env: str
) -> Iterator[ServerProcess]:
    """A server whose tenants have TURNS turns at work and a BUDGET_SECONDS request bound."""
    process = ServerProcess(
        database_url=database_url,
        data_dir=tmp_path_factory.mktemp(name),
        env={
            **SERVER_ENV,
            "DUCTOR_STREAMS_REQUESTS_AT_WORK_PER_TENANT": str(TURNS),
            "DUCTOR_STREAMS_REQUEST_TIMEOUT_SECONDS": str(BUDGET_SECONDS),
            **env,
        },
    ).start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def server(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with turns_server(database_url, tmp_path_factory, "tenant-turns") as process:
        yield process


@pytest.fixture
async def two_tenants(tokens: Tokens) -> tuple[str, str, str]:
    """The busy tenant's token, the other tenant's, and the busy tenant's name."""
    busy = f"busy-{secrets.token_hex(3)}"
    other = f"other-{secrets.token_hex(3)}"
    return await tokens.create(tenant=busy), await tokens.create(tenant=other), busy


def read(server: ServerProcess, token: str, path: str, **params: object) -> httpx.Response:
    return httpx.get(
        f"{server.base_url}{path}",
        params=params,
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )


async def test_past_its_turns_a_tenants_request_waits_and_another_tenant_is_served(
    server: ServerProcess, two_tenants: tuple[str, str, str], pool: asyncpg.Pool
) -> None:
    """The busy tenant's appends are kept at work (their stream's row locked, so their commit
    waits), on all its turns: its next request waits for one of them, and another tenant's
    goes to work at once."""
    busy, other, busy_tenant = two_tenants
    path, other_path = new_stream(server, busy), new_stream(server, other)
    assert read(server, busy, path).status_code == 200  # its token known to the process
    assert read(server, other, other_path).status_code == 200
    busy_headers = {"Authorization": f"Bearer {busy}"}
    run_id = path.split("/runs/")[1].split("/")[0]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        async with pool.acquire() as conn, conn.transaction():
            locked = await conn.fetchval(
                "SELECT count(*) FROM (SELECT 1 FROM streams WHERE tenant = $1 AND run_id = $2 "
                "FOR UPDATE) AS s",
                busy_tenant,
                run_id,
            )
            assert locked == 1
            at_work = [
                asyncio.ensure_future(
                    client.post(path, json={"records": [{"data": n}]}, headers=busy_headers)
                )
                for n in range(TURNS)
            ]
            await asyncio.sleep(0.5)
            next_one = asyncio.ensure_future(client.get(path, headers=busy_headers))
            await asyncio.sleep(0.5)
            assert not next_one.done() and not any(r.done() for r in at_work)
            answered = read(server, other, other_path)
            assert answered.status_code == 200, answered.text
            assert not next_one.done()  # still waiting for a turn of its own tenant
        # The row released: the appends commit, and the next request goes to work.
        answers = await asyncio.gather(*at_work, next_one)
    assert [a.status_code for a in answers] == [201] * TURNS + [200], answers[-1].text


def test_reads_waiting_for_records_hold_no_turn(
    server: ServerProcess, two_tenants: tuple[str, str, str]
) -> None:
    busy, _, _ = two_tenants
    path = new_stream(server, busy)
    headers = {"Authorization": f"Bearer {busy}"}
    assert read(server, busy, path).status_code == 200

    async def waiters_then_append() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
            polls = [
                asyncio.ensure_future(
                    client.get(path, params={"cursor": 0, "wait": 30}, headers=headers)
                )
                for _ in range(3 * TURNS)
            ]
            await asyncio.sleep(1.0)
            assert not any(p.done() for p in polls)
            # Six reads of the tenant wait for records, and its turns are free.
            started = time.monotonic()
            assert (await client.get(path, headers=headers)).status_code == 200
            assert time.monotonic() - started < BUDGET_SECONDS
            appended = await client.post(path, json={"records": [{"data": 7}]}, headers=headers)
            assert appended.status_code == 201, appended.text
            return await asyncio.gather(*polls)

    for answer in asyncio.run(waiters_then_append()):
        assert answer.status_code == 200, answer.text
        assert [r["data"] for r in answer.json()["records"]] == [7]


@contextlib.asynccontextmanager
async def turns_held(
    pool: asyncpg.Pool, client: httpx.AsyncClient, tenant: str, path: str, headers: dict
) -> AsyncIterator[list[asyncio.Future[httpx.Response]]]:
    """All of `tenant`'s turns held for the block: TURNS appends to `path`, its stream's row
    locked, each waiting for its commit on its turn. Their answers come once the block ends."""
    run_id = path.split("/runs/")[1].split("/")[0]
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "SELECT 1 FROM streams WHERE tenant = $1 AND run_id = $2 FOR UPDATE", tenant, run_id
        )
        yield [
            asyncio.ensure_future(
                client.post(path, json={"records": [{"data": n}]}, headers=headers)
            )
            for n in range(TURNS)
        ]


def turn_waits(server: ServerProcess) -> float:
    scraped = httpx.get(f"{server.base_url}/metrics").text
    (line,) = [
        line
        for line in scraped.splitlines()
        if line.startswith("ductor_streams_tenant_turn_waits_total ")
    ]
    return float(line.split()[1])


UNREAD = b'{"why": "a body nobody reads"}'


@contextlib.asynccontextmanager
async def sent_with_turns_held(
    server: ServerProcess,
    pool: asyncpg.Pool,
    client: httpx.AsyncClient,
    tenant: str,
    path: str,
    headers: dict,
    send: Callable[[], Awaitable[httpx.Response]],
    what: str,
) -> AsyncIterator[tuple[list[asyncio.Future[httpx.Response]], asyncio.Future[httpx.Response]]]:
    """`send()` while all of `tenant`'s turns are held (`turns_held`), found waiting for one of
    them; yields the held appends and it, still held (their answers come once the block ends)."""
    waits = turn_waits(server)
    async with turns_held(pool, client, tenant, path, headers) as at_work:
        await asyncio.sleep(0.5)
        sent = asyncio.ensure_future(send())
        await asyncio.sleep(0.5)
        assert turn_waits(server) == waits + 1, f"the {what} went to work on no turn"
        yield at_work, sent


async def test_a_close_with_a_body_it_never_reads_waits_for_a_turn_too(
    server: ServerProcess, two_tenants: tuple[str, str, str], pool: asyncpg.Pool
) -> None:
    """`POST …/close` reads no body. A request whose head announces one goes to work once its
    body is in; one the route never reads must not work on no turn at all. (Whether it
    waits is seen in the count of waits: with the tenant's appends stuck on a row lock, the
    append leader is stuck too, and so is the close's commit, turn or none.)"""
    busy, _, busy_tenant = two_tenants
    path, closing = new_stream(server, busy), new_stream(server, busy)
    assert read(server, busy, path).status_code == 200  # its token known to the process
    close = closing.removesuffix("/records") + "/close"
    busy_headers = {"Authorization": f"Bearer {busy}"}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        held = sent_with_turns_held(
            *(server, pool, client, busy_tenant, path, busy_headers),
            lambda: client.post(close, content=UNREAD, headers=busy_headers),
            "close",
        )
        async with held as (at_work, closed):
            pass
        answers = await asyncio.gather(*at_work, closed)
    assert [a.status_code for a in answers] == [201] * TURNS + [200], answers[-1].text
    assert answers[-1].json()["state"]["closed"] is True


async def test_an_object_abort_with_a_body_it_never_reads_waits_for_a_turn_too(
    server: ServerProcess, two_tenants: tuple[str, str, str], pool: asyncpg.Pool
) -> None:
    """As the close above: `POST …/objects/{id}/abort` (and `…/commit`) read no body."""
    busy, _, busy_tenant = two_tenants
    path = new_stream(server, busy)
    busy_headers = {"Authorization": f"Bearer {busy}"}
    objects = path.removesuffix("/records") + "/objects"
    body = b"an object"
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        prepared = await client.post(
            objects,
            json={
                "idempotency_key": "k1",
                "size": len(body),
                "sha256": hashlib.sha256(body).hexdigest(),
                "content_type": "application/octet-stream",
            },
            headers=busy_headers,
        )
        assert prepared.status_code in (200, 201), prepared.text
        abort = f"{objects}/{prepared.json()['object_id']}/abort"
        held = sent_with_turns_held(
            *(server, pool, client, busy_tenant, path, busy_headers),
            lambda: client.post(abort, content=UNREAD, headers=busy_headers),
            "abort",
        )
        async with held as (at_work, aborted):
            pass
        answers = await asyncio.gather(*at_work, aborted)
    assert [a.status_code for a in answers] == [201] * TURNS + [200], answers[-1].text


@pytest.mark.parametrize("surface", ["native", "durable-streams"])
async def test_a_pull_wake_ack_by_its_claim_token_waits_for_a_turn_too(
    server: ServerProcess, tokens: Tokens, pool: asyncpg.Pool, surface: str
) -> None:
    """A wake's ack (and a webhook's callback, a release) authenticates with a token that names
    the tenant and no principal: it goes to work on that tenant's turn as any request does."""
    busy_tenant = f"busy-{secrets.token_hex(3)}"
    busy = await tokens.create(tenant=busy_tenant)
    path = new_stream(server, busy)  # its appends will hold the turns
    busy_headers = {"Authorization": f"Bearer {busy}"}
    api = f"{server.base_url}/api/workflow-streams"
    root = (
        f"{api}/subscriptions"
        if surface == "native"
        else f"{server.base_url}/api/durable-streams/v1/stream/__ds/subscriptions"
    )
    name = "sub-" + secrets.token_hex(4)
    async with httpx.AsyncClient(timeout=60, headers=busy_headers) as client:
        wake_run = "wake-" + secrets.token_hex(3)
        claimed = await claimed_pull_wake(client, api, wake_run, name)
        held = sent_with_turns_held(
            *(server, pool, client, busy_tenant, server.base_url + path, busy_headers),
            lambda: client.post(
                f"{root}/{name}/ack",
                json={"wake_id": claimed["wake_id"], "generation": claimed["generation"]},
                headers={"Authorization": f"Bearer {claimed['token']}"},
            ),
            "ack",
        )
        async with held as (at_work, acked):
            assert not acked.done(), "the ack went to work on no turn"
        answers = await asyncio.gather(*at_work, acked)
    assert [a.status_code for a in answers] == [201] * TURNS + [200], answers[-1].text


WAITING = 2


@pytest.fixture(scope="module")
def short_queue(
    database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    with turns_server(
        database_url,
        tmp_path_factory,
        "tenant-turns-queue",
        DUCTOR_STREAMS_REQUESTS_WAITING_PER_TENANT=str(WAITING),
    ) as process:
        yield process


def refused_at_the_gate(server: ServerProcess) -> float:
    scraped = httpx.get(f"{server.base_url}/metrics").text
    prefix = 'ductor_streams_request_duration_seconds_count{method="POST",route="unmatched",'
    return sum(
        float(line.split()[1])
        for line in scraped.splitlines()
        if line.startswith(prefix) and 'status="429"' in line
    )


async def test_requests_arriving_together_with_bodies_are_refused_at_the_gate_past_the_queue(
    short_queue: ServerProcess, two_tenants: tuple[str, str, str], pool: asyncpg.Pool
) -> None:
    """A tenant's turns all at work and its requests with a body arriving together: those
    admitted count as waiting from the gate on, so the queue's places go to the first and the
    rest are refused there, before routing and before their bodies are read. (Counted only
    once their bodies were in, all of them were admitted at the gate, routed, and refused after:
    a flood of one tenant's acks so took the event loop's turns to seconds.)"""
    busy, other, busy_tenant = two_tenants
    server = short_queue
    path, other_path = new_stream(server, busy), new_stream(server, other)
    assert read(server, busy, path).status_code == 200  # its token known to the process
    headers = {"Authorization": f"Bearer {busy}"}
    arriving = 20
    async with httpx.AsyncClient(timeout=60) as client:
        async with turns_held(pool, client, busy_tenant, server.base_url + path, headers) as held:
            await asyncio.sleep(0.5)
            before = refused_at_the_gate(server)
            flood = [
                asyncio.ensure_future(
                    client.post(
                        server.base_url + path, json={"records": [{"data": n}]}, headers=headers
                    )
                )
                for n in range(arriving)
            ]
            async with asyncio.timeout(BUDGET_SECONDS / 2):
                while sum(f.done() for f in flood) < arriving - WAITING:
                    await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)
            admitted = [f for f in flood if not f.done()]  # waiting for a turn
            assert len(admitted) == WAITING
            refused = [f.result() for f in flood if f.done()]
            assert [a.status_code for a in refused] == [429] * (arriving - WAITING)
            assert refused_at_the_gate(server) - before == arriving - WAITING
            assert all(a.headers["connection"] == "close" for a in refused)
            answered = read(server, other, other_path)  # another tenant: at once
            assert answered.status_code == 200, answered.text
        answers = await asyncio.gather(*held, *admitted)
    assert [a.status_code for a in answers] == [201] * (TURNS + WAITING)
