"""Each tenant's turns at work in a server process, against a real server: past its turns, a
tenant's next request waits for one of its own (429 `too-many-requests` when its budget runs
out first), while another tenant is served at once; a request waiting for a live event holds no
turn."""

from __future__ import annotations

import asyncio
import secrets
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import SERVER_ENV, Tokens
from tests.integration.test_tenant_bodies import answer_of, new_stream, open_body
from tests.support.server import ServerProcess

TURNS = 2
BUDGET_SECONDS = 2


@pytest.fixture(scope="module")
def server(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(
        database_url=database_url,
        data_dir=tmp_path_factory.mktemp("tenant-turns"),
        env={
            **SERVER_ENV,
            "DUCTOR_STREAMS_REQUESTS_AT_WORK_PER_TENANT": str(TURNS),
            "DUCTOR_STREAMS_REQUEST_TIMEOUT_SECONDS": str(BUDGET_SECONDS),
        },
    ).start()
    yield process
    process.stop()


@pytest.fixture
async def two_tenants(tokens: Tokens) -> tuple[str, str]:
    suffix = secrets.token_hex(3)
    return (
        await tokens.create(tenant=f"busy-{suffix}"),
        await tokens.create(tenant=f"other-{suffix}"),
    )


def read(server: ServerProcess, token: str, path: str, **params: object) -> httpx.Response:
    return httpx.get(
        f"{server.base_url}{path}",
        params=params,
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )


def at_work(server: ServerProcess, token: str, path: str) -> list[socket.socket]:
    """`TURNS` appends of the token's tenant at work: their bodies arriving, a byte of each
    sent and taken."""
    conns = [open_body(server, token, path, 40) for _ in range(TURNS)]
    for conn in conns:
        conn.sendall(b"{")
    time.sleep(0.5)
    return conns


def test_past_its_turns_a_tenants_request_waits_and_another_tenant_is_served(
    server: ServerProcess, two_tenants: tuple[str, str]
) -> None:
    busy, other = two_tenants
    busy_path, other_path = new_stream(server, busy), new_stream(server, other)
    assert read(server, busy, busy_path).status_code == 200  # its token known to the process
    conns = at_work(server, busy, busy_path)
    try:
        started = time.monotonic()
        assert read(server, other, other_path).status_code == 200  # at once: its own turns
        assert time.monotonic() - started < BUDGET_SECONDS
        # The busy tenant's next request waits for a turn, and its budget runs out first.
        refused = read(server, busy, busy_path)
        assert refused.status_code == 429, refused.text
        assert refused.headers["content-type"].startswith("application/problem+json")
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["code"] == "too-many-requests"
        assert time.monotonic() - started >= BUDGET_SECONDS * 0.9
        # One of its requests ends: the next is at work.
        conns[0].sendall(b'"records": [{"data": 1}]}' + b" " * 14)
        status, _, answer = answer_of(conns[0])
        assert status == 201, answer
        assert read(server, busy, busy_path).status_code == 200
    finally:
        for conn in conns:
            conn.close()


def test_a_request_waits_for_a_turn_in_arrival_order_and_is_served_once_one_is_free(
    server: ServerProcess, two_tenants: tuple[str, str]
) -> None:
    busy, _ = two_tenants
    path = new_stream(server, busy)
    assert read(server, busy, path).status_code == 200
    conns = at_work(server, busy, path)
    try:

        async def queued_then_freed() -> httpx.Response:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
                waiting = asyncio.ensure_future(
                    client.get(path, headers={"Authorization": f"Bearer {busy}"})
                )
                await asyncio.sleep(0.5)
                assert not waiting.done()  # waits for a turn
                conns[1].close()  # an append given up: its turn is handed over
                return await waiting

        assert asyncio.run(queued_then_freed()).status_code == 200
    finally:
        for conn in conns:
            conn.close()


def test_reads_waiting_for_records_hold_no_turn(
    server: ServerProcess, two_tenants: tuple[str, str]
) -> None:
    busy, _ = two_tenants
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
