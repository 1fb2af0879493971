"""One cap per principal (and process) over every kind of live connection, end to end against a
real server process with a small cap (docs/http-api.md "Live connections"): native
`/subscribe`, native `records?wait=S`, Durable Streams `live=sse` and `live=long-poll`.

The excess is refused (429 `too-many-subscriptions`, Retry-After) before anything streams or
waits, everyone else keeps being served, and every way a connection can end gives its slot
back. The server's `ductor_streams_active_subscriptions` gauge says how many slots are held, so
the tests wait for the server's count instead of sleeping."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import httpx
import pytest

from adapters.postgres.tokens import PostgresTokens
from application.tokens import RevokeToken
from tests.conftest import BOOTSTRAP_TOKEN, SERVER_ENV, api_client
from tests.support.server import ServerProcess

CAP = 6  # DUCTOR_STREAMS_MAX_SUBSCRIPTIONS_PER_PRINCIPAL of this module's server
TENANT_CAP = 10  # DUCTOR_STREAMS_MAX_SUBSCRIPTIONS_PER_TENANT of this module's server
RUN_CAP = 8  # DUCTOR_STREAMS_MAX_SUBSCRIPTIONS_PER_RUN of this module's server
LONG_POLL_SECONDS = 8  # long enough to hold while the test looks, short enough to time out
NATIVE = "/api/workflow-streams"
PROTOCOL = "/api/durable-streams/v1/stream"
GAUGE = re.compile(rb"^ductor_streams_active_subscriptions (\S+)$", re.MULTILINE)


@pytest.fixture(scope="module")
def capped(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(
        database_url=database_url,
        data_dir=tmp_path_factory.mktemp("capped"),
        env={
            **SERVER_ENV,
            "DUCTOR_STREAMS_MAX_SUBSCRIPTIONS_PER_PRINCIPAL": str(CAP),
            "DUCTOR_STREAMS_MAX_SUBSCRIPTIONS_PER_TENANT": str(TENANT_CAP),
            "DUCTOR_STREAMS_MAX_SUBSCRIPTIONS_PER_RUN": str(RUN_CAP),
            "DUCTOR_STREAMS_LONG_POLL_SECONDS": str(LONG_POLL_SECONDS),
        },
    ).start()
    yield process
    process.stop()


@pytest.fixture
async def admin(capped: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(capped) as client:
        yield client


@contextlib.asynccontextmanager
async def client_of(server: ServerProcess, token: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=server.base_url,
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
    ) as client:
        yield client


async def held_slots(server: ServerProcess) -> int:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as client:
        found = GAUGE.search((await client.get("/metrics")).content)
        assert found is not None
        return int(float(found.group(1)))


async def until_held(server: ServerProcess, count: int, timeout: float = 15) -> None:
    """Wait until the server holds exactly `count` live-connection slots."""
    deadline = time.monotonic() + timeout
    while (held := await held_slots(server)) != count:
        assert time.monotonic() < deadline, f"the server holds {held} slots, not {count}"
        await asyncio.sleep(0.1)


class Live:
    """One request that may stay open: its status once the head arrives, what its body said."""

    def __init__(self, client: httpx.AsyncClient, url: str, params: dict[str, Any]) -> None:
        self.status: int | None = None
        self.headers: httpx.Headers | None = None
        self.text = ""
        self.ended = asyncio.Event()
        self.answered = asyncio.Event()
        self.task = asyncio.create_task(self._run(client, url, params))

    async def _run(self, client: httpx.AsyncClient, url: str, params: dict[str, Any]) -> None:
        try:
            async with client.stream("GET", url, params=params) as response:
                self.status, self.headers = response.status_code, response.headers
                self.answered.set()
                async for chunk in response.aiter_text():
                    self.text += chunk
        except httpx.HTTPError as error:
            self.text += f"<{type(error).__name__}>"
        finally:
            self.answered.set()
            self.ended.set()

    async def status_within(self, seconds: float = 20) -> int | None:
        async with asyncio.timeout(seconds):
            await self.answered.wait()
        return self.status

    async def until(self, text: str, seconds: float = 20) -> None:
        deadline = time.monotonic() + seconds
        while text not in self.text:
            assert time.monotonic() < deadline, f"{text!r} not in {self.text!r}"
            await asyncio.sleep(0.05)

    async def until_ended(self, seconds: float = 20) -> None:
        async with asyncio.timeout(seconds):
            await self.ended.wait()

    async def disconnect(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


def native_sse(client: httpx.AsyncClient, run_id: str, stream: str = "s") -> Live:
    return Live(client, f"{NATIVE}/runs/{run_id}/streams/{stream}/subscribe", {})


def native_wait(
    client: httpx.AsyncClient, run_id: str, cursor: int, wait: float = 30, stream: str = "s"
) -> Live:
    return Live(
        client,
        f"{NATIVE}/runs/{run_id}/streams/{stream}/records",
        {"cursor": cursor, "wait": wait},
    )


def protocol_sse(client: httpx.AsyncClient, run_id: str, stream: str = "s") -> Live:
    return Live(client, f"{PROTOCOL}/{run_id}/{stream}", {"offset": "-1", "live": "sse"})


def protocol_long_poll(
    client: httpx.AsyncClient, run_id: str, offset: str, stream: str = "s"
) -> Live:
    return Live(client, f"{PROTOCOL}/{run_id}/{stream}", {"offset": offset, "live": "long-poll"})


async def create(admin: httpx.AsyncClient, run_id: str, stream: str = "s", **extra: Any) -> None:
    created = await admin.post(
        f"/runs/{run_id}/streams", json={"stream_id": stream, "direction": "output", **extra}
    )
    assert created.status_code == 201, created.text


async def append(admin: httpx.AsyncClient, run_id: str, data: Any, stream: str = "s") -> int:
    answer = await admin.post(
        f"/runs/{run_id}/streams/{stream}/records", json={"records": [{"data": data}]}
    )
    assert answer.status_code == 201, answer.text
    return answer.json()["last_sequence"]


def offset_of(sequence: int) -> str:
    return f"{0:016d}_{sequence:016d}"


async def assert_refused(live: Live) -> None:
    """429 too-many-subscriptions as problem+json with Retry-After, before any streaming."""
    assert await live.status_within() == 429, live.text
    await live.until_ended()
    assert live.headers is not None
    assert live.headers["content-type"].startswith("application/problem+json")
    retry_after = live.headers.get("retry-after")
    assert retry_after is not None and retry_after.isdigit() and int(retry_after) >= 1
    assert '"code":"too-many-subscriptions"' in live.text, live.text


async def fill_to_the_cap(server: ServerProcess, client: httpx.AsyncClient, run_id: str) -> None:
    """The principal's whole cap is free: `CAP` subscriptions are served, one more is refused;
    then they are let go again (and the server gives their slots back)."""
    before = await held_slots(server)
    held = [native_sse(client, run_id) for _ in range(CAP)]
    assert [await s.status_within() for s in held] == [200] * CAP, [s.text for s in held]
    await until_held(server, before + CAP)
    await assert_refused(native_sse(client, run_id))
    for live in held:
        await live.disconnect()
    await until_held(server, before)


async def test_one_token_past_the_cap_is_refused_on_every_kind_and_everyone_else_is_served(
    capped: ServerProcess, admin: httpx.AsyncClient, tokens, run_id: str
) -> None:
    await create(admin, run_id)
    head = await append(admin, run_id, "first")
    reader = await tokens.create(principal="capped-" + run_id, scopes=("streams:read",))
    other = await tokens.create(principal="other-" + run_id, scopes=("streams:read",))
    async with client_of(capped, reader) as client, client_of(capped, other) as others:
        held = [
            native_sse(client, run_id),
            native_sse(client, run_id),
            protocol_sse(client, run_id),
            protocol_sse(client, run_id),
            native_wait(client, run_id, head),
            protocol_long_poll(client, run_id, offset_of(head)),
        ]
        assert len(held) == CAP
        for live in held[:4]:
            assert await live.status_within() == 200, live.text
        await until_held(capped, CAP)

        # One more of each kind, with the same token: refused before streaming or waiting.
        for excess in (
            native_sse(client, run_id),
            protocol_sse(client, run_id),
            native_wait(client, run_id, head),
            protocol_long_poll(client, run_id, offset_of(head)),
        ):
            await assert_refused(excess)
        # A read that has not to wait holds nothing, so it is served at the cap.
        page = await client.get(f"{NATIVE}/runs/{run_id}/streams/s/records", params={"wait": 30})
        assert page.status_code == 200 and len(page.json()["records"]) == 1

        # Another principal is served on every kind meanwhile.
        theirs = [
            native_sse(others, run_id),
            protocol_sse(others, run_id),
            native_wait(others, run_id, head),
            protocol_long_poll(others, run_id, offset_of(head)),
        ]
        for live in theirs[:2]:
            assert await live.status_within() == 200, live.text
        await until_held(capped, CAP + 4)

        # Everyone keeps being served: the next record reaches every open connection.
        await append(admin, run_id, "second")
        for live in [*held, *theirs]:
            await live.until("second")
        for live in (held[4], held[5], theirs[2], theirs[3]):
            await live.until_ended()
            assert live.status == 200, live.text
        for live in [*held, *theirs]:
            await live.disconnect()
        await until_held(capped, 0)
        await fill_to_the_cap(capped, client, run_id)


async def test_a_tenants_principals_together_are_capped_and_other_tenants_are_served(
    capped: ServerProcess, admin: httpx.AsyncClient, tokens, run_id: str
) -> None:
    """A tenant's administrator may mint tokens for any number of principals: together they
    hold at most the tenant's cap, and another tenant's principal is served meanwhile."""
    await create(admin, run_id)
    first = await tokens.create(principal="first-" + run_id, scopes=("streams:read",))
    second = await tokens.create(principal="second-" + run_id, scopes=("streams:read",))
    elsewhere = "t2-" + run_id
    outsider = await tokens.create(tenant=elsewhere, principal="first-" + run_id)
    async with (
        client_of(capped, first) as ones,
        client_of(capped, second) as twos,
        client_of(capped, outsider) as others,
    ):
        created = await others.post(
            f"{NATIVE}/runs/{run_id}/streams", json={"stream_id": "s", "direction": "output"}
        )
        assert created.status_code == 201, created.text
        held = [native_sse(ones, run_id) for _ in range(CAP)]
        held += [native_sse(twos, run_id) for _ in range(TENANT_CAP - CAP)]
        for live in held:
            assert await live.status_within() == 200, live.text
        await until_held(capped, TENANT_CAP)
        # Below its own cap, the second principal is refused: the tenant's is reached.
        await assert_refused(native_sse(twos, run_id))
        theirs = native_sse(others, run_id)
        assert await theirs.status_within() == 200, theirs.text
        for live in [*held, theirs]:
            await live.disconnect()
        await until_held(capped, 0)


async def test_an_administrator_of_one_run_holds_its_runs_share_and_other_runs_are_served(
    capped: ServerProcess, admin: httpx.AsyncClient, run_id: str
) -> None:
    """An administrator of one run may mint tokens over HTTP for any number of principals: all
    the tokens restricted to its run hold at most the run's cap, and the tenant's other runs
    (and its other principals) are served meanwhile."""
    other = run_id + "-other"
    await create(admin, run_id)
    await create(admin, other)
    minted = await admin.post(
        "/tokens",
        json={
            "principal": "run-admin-" + run_id,
            "scopes": ["streams:read", "streams:admin"],
            "expires_in_seconds": 600,
            "runs": [run_id],
        },
    )
    assert minted.status_code == 201, minted.text
    async with client_of(capped, minted.json()["token"]) as run_admin:
        names = [f"p{i}-{run_id}" for i in range(RUN_CAP // CAP + 2)]
        tokens = []
        for name in names:
            answer = await run_admin.post(
                f"{NATIVE}/tokens",
                json={
                    "principal": name,
                    "scopes": ["streams:read"],
                    "expires_in_seconds": 300,
                    "runs": [run_id],
                },
            )
            assert answer.status_code == 201, answer.text
            tokens.append(answer.json()["token"])
        async with contextlib.AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(client_of(capped, t)) for t in tokens]
            held = [native_sse(clients[i // CAP], run_id) for i in range(RUN_CAP)]
            for live in held:
                assert await live.status_within() == 200, live.text
            await until_held(capped, RUN_CAP)
            # The last principal holds nothing yet; the run's share is taken, on both surfaces.
            await assert_refused(native_sse(clients[-1], run_id))
            await assert_refused(protocol_sse(clients[-1], run_id))
            refused = await clients[-1].get(
                f"{NATIVE}/runs/{run_id}/streams/s/subscribe", timeout=10
            )
            assert refused.status_code == 429 and "run" in refused.json()["detail"]
            # Another run of the tenant is served: the tenant's cap is not reached.
            tenants = await stack.enter_async_context(client_of(capped, BOOTSTRAP_TOKEN))
            for _ in range(TENANT_CAP - RUN_CAP):
                theirs = native_sse(tenants, other)
                assert await theirs.status_within() == 200, theirs.text
                held.append(theirs)
            await until_held(capped, TENANT_CAP)
            for live in held:
                await live.disconnect()
            await until_held(capped, 0)


async def test_slots_come_back_when_clients_disconnect(
    capped: ServerProcess, admin: httpx.AsyncClient, tokens, run_id: str
) -> None:
    await create(admin, run_id)
    head = await append(admin, run_id, 1)
    reader = await tokens.create(principal="leaver-" + run_id, scopes=("streams:read",))
    async with client_of(capped, reader) as client:
        for _ in range(2):  # twice the cap in all: a leaked slot would show the second time
            held = [
                native_sse(client, run_id),
                native_sse(client, run_id),
                protocol_sse(client, run_id),
                protocol_sse(client, run_id),
                native_wait(client, run_id, head, wait=LONG_POLL_SECONDS),
                protocol_long_poll(client, run_id, offset_of(head)),
            ]
            for live in held[:4]:
                assert await live.status_within() == 200, live.text
            await until_held(capped, CAP)
            for live in held:
                await live.disconnect()
            # Every one ends when its client leaves: the waits too, long before their deadline
            # (entrypoints/edge/leaving.py).
            await until_held(capped, 0, timeout=LONG_POLL_SECONDS / 2)
        await fill_to_the_cap(capped, client, run_id)


async def test_slots_come_back_when_waits_time_out(
    capped: ServerProcess, admin: httpx.AsyncClient, tokens, run_id: str
) -> None:
    await create(admin, run_id)
    head = await append(admin, run_id, 1)
    reader = await tokens.create(principal="patient-" + run_id, scopes=("streams:read",))
    async with client_of(capped, reader) as client:
        waits = [native_wait(client, run_id, head, wait=2) for _ in range(3)]
        polls = [protocol_long_poll(client, run_id, offset_of(head)) for _ in range(3)]
        await until_held(capped, CAP)
        for live in [*waits, *polls]:
            await live.until_ended(LONG_POLL_SECONDS + 10)
        assert [w.status for w in waits] == [200] * 3
        assert all(w.text.count('"records":[]') == 1 for w in waits), [w.text for w in waits]
        assert [p.status for p in polls] == [204] * 3
        await until_held(capped, 0)
        await fill_to_the_cap(capped, client, run_id)


async def test_slots_come_back_when_the_stream_closes(
    capped: ServerProcess, admin: httpx.AsyncClient, tokens, run_id: str
) -> None:
    await create(admin, run_id, "ends")
    await create(admin, run_id)
    head = await append(admin, run_id, 1, stream="ends")
    reader = await tokens.create(principal="finisher-" + run_id, scopes=("streams:read",))
    async with client_of(capped, reader) as client:
        held = [
            native_sse(client, run_id, "ends"),
            native_sse(client, run_id, "ends"),
            protocol_sse(client, run_id, "ends"),
            protocol_sse(client, run_id, "ends"),
            native_wait(client, run_id, head, stream="ends"),
            protocol_long_poll(client, run_id, offset_of(head), stream="ends"),
        ]
        for live in held[:4]:
            assert await live.status_within() == 200, live.text
        await until_held(capped, CAP)
        closed = await admin.post(f"/runs/{run_id}/streams/ends/close")
        assert closed.status_code == 200, closed.text
        for live in held:
            await live.until_ended()
        assert "event: closed" in held[0].text and '"streamClosed":true' in held[2].text
        await until_held(capped, 0)
        await fill_to_the_cap(capped, client, run_id)


async def test_slots_come_back_when_the_stream_is_deleted(
    capped: ServerProcess, admin: httpx.AsyncClient, tokens, run_id: str
) -> None:
    await create(admin, run_id, "doomed")
    await create(admin, run_id)
    head = await append(admin, run_id, 1, stream="doomed")
    reader = await tokens.create(principal="bereaved-" + run_id, scopes=("streams:read",))
    async with client_of(capped, reader) as client:
        held = [
            native_sse(client, run_id, "doomed"),
            native_sse(client, run_id, "doomed"),
            protocol_sse(client, run_id, "doomed"),
            protocol_sse(client, run_id, "doomed"),
            native_wait(client, run_id, head, stream="doomed"),
            protocol_long_poll(client, run_id, offset_of(head), stream="doomed"),
        ]
        for live in held[:4]:
            assert await live.status_within() == 200, live.text
        await until_held(capped, CAP)
        deleted = await admin.delete(f"/runs/{run_id}/streams/doomed")
        assert deleted.status_code == 204, deleted.text
        for live in held:
            await live.until_ended()
        assert "event: deleted" in held[0].text
        assert held[4].status == 404 and held[5].status == 404
        await until_held(capped, 0)
        await fill_to_the_cap(capped, client, run_id)


async def test_slots_come_back_when_the_token_is_revoked(
    capped: ServerProcess, admin: httpx.AsyncClient, tokens, pool: asyncpg.Pool, run_id: str
) -> None:
    """A connection ended by an error (here its token revoked: 401 for waits, `revoked` or the
    end of the response for streams) gives its slot back like any other end."""
    await create(admin, run_id)
    head = await append(admin, run_id, 1)
    principal = "revoked-" + run_id
    reader = await tokens.create(principal=principal, scopes=("streams:read",))
    async with client_of(capped, reader) as client:
        held = [
            native_sse(client, run_id),
            native_sse(client, run_id),
            protocol_sse(client, run_id),
            protocol_sse(client, run_id),
            native_wait(client, run_id, head),
            protocol_long_poll(client, run_id, offset_of(head)),
        ]
        for live in held[:4]:
            assert await live.status_within() == 200, live.text
        await until_held(capped, CAP)
        await RevokeToken(PostgresTokens(pool))(reader)
        for live in held:
            await live.until_ended()
        assert "event: revoked" in held[0].text
        assert held[4].status == 401 and held[5].status == 401
        await until_held(capped, 0)
    again = await tokens.create(principal=principal, scopes=("streams:read",))
    async with client_of(capped, again) as client:
        await fill_to_the_cap(capped, client, run_id)
