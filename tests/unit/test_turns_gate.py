"""The turns gate at a request's first step (entrypoints/edge/turns.py), over a stand-in app:
a known token's request waits for its tenant's turn, or is answered 429 within its budget; a
turn comes back as the answer starts; a request with a body takes its turn once the body is in."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from application import waiting
from application.access import Caller
from application.jwts import JwtCallers
from application.tokens import TokenCache, token_hash
from entrypoints.edge.body import with_body_deadlines
from entrypoints.edge.exchange import UNMATCHED
from entrypoints.edge.metrics import HOT
from entrypoints.edge.turns import with_turns
from entrypoints.http.app import with_budget

TOKEN = "dst_known"
JWT = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJzIn0.c2ln"


@pytest.fixture(autouse=True)
def one_turn() -> Iterator[None]:
    waiting.configure_turns(1)
    yield
    waiting.configure_turns(0)
    assert not waiting._turns  # every turn came back


def cache_knowing(tenant: str) -> TokenCache:
    cache = TokenCache()
    caller = Caller(tenant=tenant, principal="p", scopes=frozenset({"streams:read"}))
    cache.remember(token_hash(TOKEN), caller, None, cache.generation)
    return cache


class Stalling:
    """An app that works until `go` is set (or answers at once, then writes slowly)."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.entered = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        self.entered += 1
        if scope["path"] == "/answer-then-write":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await self.go.wait()  # writing its answer, at its client's pace
        else:
            await self.go.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def call(app: Any, path: str = "/", token: str = TOKEN, method: str = "GET") -> list[dict]:
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": [(b"authorization", f"Bearer {token}".encode())],
    }
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def counted_429() -> int:
    cell = HOT.requests.get(("GET", UNMATCHED, "429"))
    return 0 if cell is None else int(sum(cell[:-1]))


async def test_a_known_tokens_request_past_its_tenants_turns_is_answered_429() -> None:
    inner = Stalling()
    app = with_budget(with_turns(inner, cache_knowing("t1"), []), 0.2)
    working = asyncio.ensure_future(call(app))
    await asyncio.sleep(0.01)
    before = counted_429()
    refused = await call(app)
    assert inner.entered == 1  # never reached the app
    start, body = refused
    headers = dict(start["headers"])
    assert start["status"] == 429
    assert headers[b"content-type"] == b"application/problem+json"
    assert headers[b"retry-after"] == b"1" and headers[b"connection"] == b"close"
    assert headers[b"x-request-id"]  # as every answer carries, the router's or not
    assert json.loads(body["body"])["code"] == "too-many-requests"
    assert counted_429() == before + 1  # in /metrics' request counts
    head = await call(app, method="HEAD")
    assert head[0]["status"] == 429 and head[1]["body"] == b""
    # A JWT this process has not verified is not known here (its turn is taken as it
    # authenticates).
    jwt = asyncio.ensure_future(call(app, token=JWT))
    await asyncio.sleep(0.01)
    assert inner.entered == 2
    inner.go.set()
    await asyncio.gather(working, jwt)


class Verifier:
    async def verify(self, token: str) -> dict:
        return {"sub": "s", "tenant": "t1", "scope": "streams:read", "exp": 10**10}


async def test_a_jwt_the_process_verified_is_known_at_the_gate() -> None:
    """Its tenant's turns taken, a request with a JWT this process verified and remembers is
    refused at the gate as a known token's is, before routing; one it never verified is let
    through to authenticate (and to take its turn there)."""
    jwts = JwtCallers(Verifier())
    cache = TokenCache(jwts=jwts)
    caller = await jwts(JWT)
    cache.remember(token_hash(TOKEN), caller, None, cache.generation)
    inner = Stalling()
    app = with_budget(with_turns(inner, cache, []), 0.2)
    working = asyncio.ensure_future(call(app))  # tenant t1's one turn
    await asyncio.sleep(0.01)
    refused = await asyncio.wait_for(call(app, token=JWT), 2.0)  # (not let through to work)
    assert refused[0]["status"] == 429 and inner.entered == 1
    unknown = asyncio.ensure_future(call(app, token="eyJ4IjoxfQ.eyJ5IjoxfQ.eg"))
    await asyncio.sleep(0.01)
    assert inner.entered == 2
    inner.go.set()
    await asyncio.gather(working, unknown)


async def test_a_request_gives_its_turn_back_as_its_answer_starts() -> None:
    inner = Stalling()
    app = with_budget(with_turns(inner, cache_knowing("t1"), []), 1.0)
    writing = asyncio.ensure_future(call(app, "/answer-then-write"))
    await asyncio.sleep(0.01)
    other = asyncio.ensure_future(call(app))  # goes to work while the first one writes
    await asyncio.sleep(0.01)
    assert inner.entered == 2
    inner.go.set()
    await asyncio.gather(writing, other)


async def test_a_request_with_a_body_takes_its_turn_once_the_body_is_in() -> None:
    async def posting(arrived: asyncio.Event, log: list[str]) -> None:
        with waiting.request_budget(5.0, body_to_come=True):
            waiting.act_for("t1")
            await waiting.take_turn("t1")  # as it authenticates: not yet at work
            log.append("authenticated")
            await arrived.wait()  # its body arriving
            await waiting.body_arrived()
            log.append("at work")
            await asyncio.sleep(0.01)

    arrived = asyncio.Event()
    log: list[str] = []
    slow = [asyncio.ensure_future(posting(arrived, log)) for _ in range(3)]
    await asyncio.sleep(0.01)
    assert log == ["authenticated"] * 3  # three slow bodies on one turn: none at work
    with waiting.request_budget(0.1):  # another request of the tenant is not kept waiting
        await waiting.take_turn("t1")
    arrived.set()
    await asyncio.gather(*slow)
    assert log.count("at work") == 3


class NoBodyRead:
    """A POST route that never reads its body (close a stream, commit or abort an object),
    authenticating as `Authenticate` does, then working until `go`."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.at_work = 0
        self.most = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        waiting.act_for("t1")
        await waiting.take_turn("t1")
        self.at_work += 1
        self.most = max(self.most, self.at_work)
        await self.go.wait()
        self.at_work -= 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


async def post_without_body(app: Any) -> None:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/api/workflow-streams/runs/r/streams/s/close",
        "headers": [(b"authorization", f"Bearer {TOKEN}".encode())],
    }

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        pass

    await app(scope, receive, send)


async def test_a_post_that_never_reads_its_body_still_takes_a_turn() -> None:
    inner = NoBodyRead()
    app = with_body_deadlines(
        with_budget(with_turns(inner, cache_knowing("t1"), []), 1.0), 30.0, 120.0
    )
    posts = [asyncio.ensure_future(post_without_body(app)) for _ in range(5)]
    await asyncio.sleep(0.05)
    most = inner.most
    inner.go.set()
    await asyncio.gather(*posts, return_exceptions=True)
    # One turn per tenant: one of them at work at a time (the others wait, or 429).
    assert most == 1, f"{most} body-less POSTs of one tenant at work on 1 turn"


async def test_a_wake_routes_token_is_taken_for_its_tenant_at_the_gate() -> None:
    """A webhook's callback or a pull-wake ack or release carries the wake's own token: the gate
    learns its tenant from it (its signature checked) and takes that tenant's turn there, so a
    flood of them past the tenant's queue is refused before routing. Another path, or a token
    that is not valid, is left to the route."""
    from entrypoints.edge.turns import wake_tenant

    def tenant_of(token: str, subscription_id: str) -> str:
        if token != "wake-token" or subscription_id != "sub-1":
            raise ValueError("not valid")
        return "t1"

    def scope(path: str, token: str = "wake-token", method: str = "POST") -> dict:
        headers = [(b"authorization", f"Bearer {token}".encode())]
        return {"type": "http", "method": method, "path": path, "headers": headers}

    native = "/api/workflow-streams/subscriptions/sub-1/ack"
    protocol = "/api/durable-streams/v1/stream/__ds/subscriptions/sub-1/callback"
    assert wake_tenant(scope(native), tenant_of) == "t1"
    assert wake_tenant(scope(protocol), tenant_of) == "t1"
    assert wake_tenant(scope(native.replace("/ack", "/release")), tenant_of) == "t1"
    assert wake_tenant(scope(native, token="forged"), tenant_of) is None
    assert wake_tenant(scope(native, method="GET"), tenant_of) is None
    assert wake_tenant(scope(native.replace("/ack", "/claim")), tenant_of) is None

    inner = Stalling()
    waiting.configure_turns(1, waiting_per_tenant=1)
    app = with_budget(with_turns(inner, TokenCache(), [], tenant_of), 1.0)
    working = asyncio.ensure_future(call(app, native, token="wake-token", method="POST"))
    queued = asyncio.ensure_future(call(app, native, token="wake-token", method="POST"))
    await asyncio.sleep(0.01)
    refused = await call(app, native, token="wake-token", method="POST")
    assert refused[0]["status"] == 429 and inner.entered == 1  # never routed
    inner.go.set()
    await asyncio.gather(working, queued)
