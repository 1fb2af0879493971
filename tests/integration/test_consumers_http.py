"""Who may hold a stream's writers back, the removal of a consumer, and the consumers' bounds
(docs/http-api.md "Consumers and credit"), against a real server."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import BOOTSTRAP_TOKEN, SERVER_ENV, api_client
from tests.integration.test_http_acks import assert_problem
from tests.support.server import ServerProcess

READ, WRITE, ADMIN = "streams:read", "streams:write", "streams:admin"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def create(api: httpx.AsyncClient, run_id: str, **limits: Any) -> str:
    created = await api.post(
        f"/runs/{run_id}/streams",
        json={"stream_id": "s", "direction": "output", "limits": limits},
    )
    assert created.status_code == 201, created.text
    return f"/runs/{run_id}/streams/s"


async def append(api: httpx.AsyncClient, path: str, n: int = 1, **kwargs: Any) -> httpx.Response:
    return await api.post(
        f"{path}/records", json={"records": [{"data": i} for i in range(n)]}, **kwargs
    )


async def ack(
    api: httpx.AsyncClient, path: str, consumer: str, sequence: int, **kwargs: Any
) -> httpx.Response:
    return await api.post(f"{path}/consumers/{consumer}/ack", json={"sequence": sequence}, **kwargs)


async def state(api: httpx.AsyncClient, path: str) -> dict[str, Any]:
    response = await api.get(path)
    assert response.status_code == 200, response.text
    return response.json()["state"]


async def test_a_read_only_token_cannot_stop_the_writers(
    api: httpx.AsyncClient, run_id: str, tokens: Any
) -> None:
    """The defect as found: on a stream whose only consumer had acknowledged the head, a token
    with only streams:read acknowledged a new consumer at 0, and every append from then on was
    429, with nothing the writer could do about it."""
    path = await create(api, run_id, max_unread_items=5)
    assert (await append(api, path, 5)).status_code == 201
    assert (await ack(api, path, "writer-side", 5)).status_code == 200
    reader = bearer(await tokens.create(principal="nosy-" + secrets.token_hex(3), scopes=(READ,)))
    tracked = await ack(api, path, "reader-side", 0, headers=reader)
    assert tracked.status_code == 200, tracked.text
    assert tracked.json()["credit"]["unread_items"] == 0  # it held nothing back
    statuses = [(await append(api, path)).status_code for _ in range(7)]
    assert statuses == [201] * 5 + [429] * 2  # the writer's own consumer is what holds it now
    consumers = {c["consumer_id"]: c for c in (await state(api, path))["consumers"]}
    assert consumers["reader-side"] == {
        "consumer_id": "reader-side",
        "acked_sequence": 0,
        "holds_credit": False,
    }
    assert consumers["writer-side"]["holds_credit"] is True
    # The reader's consumer still tracks its position, and can still only advance.
    moved = await ack(api, path, "reader-side", 3, headers=reader)
    assert moved.status_code == 200 and moved.json()["acked_sequence"] == 3
    assert_problem(await ack(api, path, "reader-side", 1, headers=reader), 409, "ack-regression")


async def test_write_scope_without_being_a_writer_of_the_stream_holds_nothing_back(
    api: httpx.AsyncClient, run_id: str, tokens: Any
) -> None:
    created = await api.post(
        f"/runs/{run_id}/streams",
        json={
            "stream_id": "pinned",
            "direction": "output",
            "limits": {"max_unread_items": 2},
            "authorization": {"readers": ["*"], "writers": ["bootstrap"]},
        },
    )
    assert created.status_code == 201, created.text
    path = f"/runs/{run_id}/streams/pinned"
    outsider = bearer(await tokens.create(principal="outsider", scopes=(READ, WRITE)))
    admin = bearer(await tokens.create(principal="auditor", scopes=(READ, ADMIN)))
    assert (await ack(api, path, "outsider", 0, headers=outsider)).status_code == 200
    assert (await ack(api, path, "auditor", 0, headers=admin)).status_code == 200
    held = {c["consumer_id"]: c["holds_credit"] for c in (await state(api, path))["consumers"]}
    assert held == {"outsider": False, "auditor": True}


async def test_an_admin_removes_a_consumer_and_what_it_held_is_released(
    api: httpx.AsyncClient, run_id: str, tokens: Any
) -> None:
    path = await create(api, run_id, max_unread_items=3)
    assert (await ack(api, path, "stuck", 0)).status_code == 200
    assert (await append(api, path, 3)).status_code == 201
    assert_problem(await append(api, path), 429, "backpressure")
    hold = await api.put(f"{path}/legal-hold", json={"enabled": True, "reason": "audit"})
    assert hold.status_code == 200, hold.text
    writer = bearer(await tokens.create(principal="bootstrap", scopes=(READ, WRITE)))
    assert_problem(await api.delete(f"{path}/consumers/stuck", headers=writer), 403, "forbidden")
    removed = await api.delete(f"{path}/consumers/stuck")  # the bootstrap token is an admin
    assert removed.status_code == 204, removed.text
    assert removed.content == b""
    after = await state(api, path)
    assert after["consumers"] == [] and after["consumer_count"] == 0
    assert after["credit"]["unread_items"] == 3  # all of it, with no consumer: as before it
    assert_problem(await api.delete(f"{path}/consumers/stuck"), 404, "not-found")
    assert_problem(await api.delete(f"{path}/consumers/never"), 404, "not-found")
    # The ID is free again: a new consumer, starting where it acknowledges.
    again = await ack(api, path, "stuck", 3)
    assert again.status_code == 200 and again.json()["credit"]["unread_items"] == 0
    assert (await append(api, path)).status_code == 201
    other = f"/runs/{run_id}-x/streams/s/consumers/stuck"
    assert_problem(await api.delete(other), 404, "not-found")


async def test_the_document_shows_a_page_of_consumers_and_the_rest_are_listed_by_keyset(
    api: httpx.AsyncClient, run_id: str
) -> None:
    path = await create(api, run_id)
    assert (await append(api, path)).status_code == 201
    names = [f"c{n:03d}" for n in range(130)]
    for group in range(0, len(names), 10):
        acks = [ack(api, path, name, 1) for name in names[group : group + 10]]
        assert all(r.status_code == 200 for r in await asyncio.gather(*acks))
    document = await state(api, path)
    assert document["consumer_count"] == 130
    assert [c["consumer_id"] for c in document["consumers"]] == names[:100]
    listed: list[str] = []
    after: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 50} | ({"after": after} if after else {})
        page = await api.get(f"{path}/consumers", params=params)
        assert page.status_code == 200, page.text
        body = page.json()
        assert set(body) == {"consumers", "next_after"}
        listed += [c["consumer_id"] for c in body["consumers"]]
        after = body["next_after"]
        if after is None:
            break
        assert after == listed[-1]
    assert listed == names
    assert (await api.get(f"{path}/consumers", params={"after": "c129"})).json() == {
        "consumers": [],
        "next_after": None,
    }
    for bad in ({"limit": 0}, {"limit": 1001}, {"after": "bad id"}):
        assert_problem(await api.get(f"{path}/consumers", params=bad), 400, "invalid-input")
    assert_problem(await api.get(f"/runs/{run_id}/streams/nosuch/consumers"), 404, "not-found")


MAX_CONSUMERS = 3


@pytest.fixture(scope="module")
def bounded_server(
    database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    env = {**SERVER_ENV, "DUCTOR_STREAMS_MAX_CONSUMERS_PER_STREAM": str(MAX_CONSUMERS)}
    process = ServerProcess(
        database_url=database_url, data_dir=tmp_path_factory.mktemp("bounded"), env=env
    ).start()
    yield process
    process.stop()


@pytest.fixture
async def bounded(bounded_server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(bounded_server, BOOTSTRAP_TOKEN) as client:
        yield client


async def test_a_stream_holds_a_bounded_number_of_consumers_of_each_kind(
    bounded: httpx.AsyncClient, run_id: str, tokens: Any
) -> None:
    path = await create(bounded, run_id)
    assert (await append(bounded, path, 2)).status_code == 201
    for n in range(MAX_CONSUMERS):
        assert (await ack(bounded, path, f"w{n}", 0)).status_code == 200
    before = await state(bounded, path)
    refused = assert_problem(await ack(bounded, path, "w-extra", 0), 409, "too-many-consumers")
    assert refused["max_consumers"] == MAX_CONSUMERS and refused["holds_credit"] is True
    assert await state(bounded, path) == before
    # The existing ones go on acknowledging.
    assert (await ack(bounded, path, "w0", 2)).status_code == 200
    # Readers have their own room: they can never use up the writers' (nor the reverse).
    # And each reader a tenth of it (here 1): one reader never uses up the other readers'.
    readers = [
        bearer(await tokens.create(principal=f"reader{n}", scopes=(READ,)))
        for n in range(MAX_CONSUMERS + 1)
    ]
    assert (await ack(bounded, path, "r0", 0, headers=readers[0])).status_code == 200
    refused = assert_problem(
        await ack(bounded, path, "r0-extra", 0, headers=readers[0]), 409, "too-many-consumers"
    )
    assert refused["holds_credit"] is False and refused["max_consumers"] == 1
    for n in range(1, MAX_CONSUMERS):
        assert (await ack(bounded, path, f"r{n}", 0, headers=readers[n])).status_code == 200
    refused = assert_problem(
        await ack(bounded, path, "r-extra", 0, headers=readers[-1]), 409, "too-many-consumers"
    )
    assert refused["holds_credit"] is False and refused["max_consumers"] == MAX_CONSUMERS
    # An admin's removal makes room.
    assert (await bounded.delete(f"{path}/consumers/w1")).status_code == 204
    assert (await ack(bounded, path, "w-extra", 0)).status_code == 200
    assert (await state(bounded, path))["consumer_count"] == 2 * MAX_CONSUMERS
