"""One table of appends, on both surfaces, sent to the application with its append front and
to the same application without it (every append through Litestar's route): each answer must
be the same, status, headers and body (the order of the headers aside)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, NamedTuple

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from application.access import SCOPES
from application.tokens import IssueToken, make_caller
from entrypoints.container import memory_container
from entrypoints.http.app import MAX_REQUEST_BYTES, create_app
from tests.support.asgi import http_scope

WRITER = "dst_writer_" + "a" * 16
READER = "dst_reader_" + "b" * 16
NATIVE = "/api/workflow-streams/runs/r/streams/s/records"
DS = "/api/durable-streams/v1/stream/r/p"
DS_DEFAULT_RUN = "/api/durable-streams/v1/stream/d"
JSON = {"content-type": "application/json"}
TEXT = {"content-type": "text/plain"}
GOOD = b'{"records":[{"data":1}]}'
OVER = b"x" * (MAX_REQUEST_BYTES + 1)


def producer(epoch: int, seq: int, name: str = "p1") -> dict[str, str]:
    return {"producer-id": name, "producer-epoch": str(epoch), "producer-seq": str(seq)}


class Case(NamedTuple):
    name: str
    path: str
    body: bytes
    headers: dict[str, str]
    token: str | None = WRITER
    repeated: tuple[tuple[str, bytes], ...] = ()  # headers added as they are, after `headers`
    status: int | None = None  # the answer's status, where the case is there for one


# In order: each case sees the state the ones before it left, on both applications alike.
TABLE = [
    Case("native good", NATIVE, GOOD, JSON),
    Case("native keyed", NATIVE, GOOD, {**JSON, "idempotency-key": "k1"}),
    Case("native replayed", NATIVE, GOOD, {**JSON, "idempotency-key": "k1"}),
    Case("native key reused", NATIVE, b'{"records":[{"data":2}]}', {"idempotency-key": "k1"}),
    Case("native malformed", NATIVE, b"{", JSON),
    Case("native invalid", NATIVE, b'{"records":[]}', JSON),
    Case("native bad key", NATIVE, GOOD, {"idempotency-key": "\x7f"}),
    Case("native no stream", NATIVE.replace("/s/", "/nope/"), GOOD, JSON),
    Case("native bad id", NATIVE.replace("/s/", "/-bad-/"), GOOD, JSON),
    Case("native encoded slash (the router's)", NATIVE.replace("/s/", "/a%2Fb/"), GOOD, JSON),
    Case("native gzip", NATIVE, GOOD, {**JSON, "content-encoding": "gzip"}),
    Case("native oversized", NATIVE, OVER, JSON),
    Case("native oversized unauthenticated", NATIVE, OVER, JSON, None),
    Case("native unauthenticated", NATIVE, GOOD, JSON, None),
    Case("native unknown token", NATIVE, GOOD, JSON, "dst_no_such_token"),
    Case("native read-only token", NATIVE, GOOD, JSON, READER),
    Case("native cors", NATIVE, GOOD, {**JSON, "origin": "https://app.example"}),
    Case("ds good", DS, b"hello", TEXT),
    Case("ds default run", DS_DEFAULT_RUN, b'{"a":1}', JSON),
    Case("ds producer", DS, b"one", {**TEXT, **producer(0, 0)}),
    Case("ds producer replayed", DS, b"one", {**TEXT, **producer(0, 0)}),
    Case("ds producer gap", DS, b"three", {**TEXT, **producer(0, 2)}),
    Case("ds producer new epoch", DS, b"two", {**TEXT, **producer(1, 0)}),
    Case("ds producer stale", DS, b"old", {**TEXT, **producer(0, 1)}),
    Case("ds producer partial", DS, b"x", {**TEXT, "producer-id": "p1"}),
    Case(
        "ds producer epoch not a number",
        DS,
        b"x",
        {**TEXT, **producer(0, 0), "producer-epoch": "x"},
    ),
    Case("ds stream-seq", DS, b"s1", {**TEXT, "stream-seq": "0001"}),
    Case("ds stream-seq regression", DS, b"s0", {**TEXT, "stream-seq": "0000"}),
    Case("ds stream-seq too long", DS, b"s2", {**TEXT, "stream-seq": "9" * 256}),
    Case(
        "ds content type twice",
        DS,
        b"x",
        TEXT,
        repeated=(("content-type", b"text/plain"),),
        status=400,
    ),
    Case(
        "ds stream-seq twice",
        DS,
        b"x",
        {**TEXT, "stream-seq": "0002"},
        repeated=(("stream-seq", b"0003"),),
        status=400,
    ),
    Case(
        "ds producer epoch twice",
        DS,
        b"x",
        {**TEXT, **producer(1, 1)},
        repeated=(("producer-epoch", b"1"),),
        status=400,
    ),
    Case("ds stream-seq not ascii", DS, b"x", TEXT, WRITER, (("stream-seq", b"\xe9"),), 400),
    Case("ds closed twice", DS, b"x", TEXT, WRITER, (("stream-closed", b"true"),) * 2, 400),
    Case("ds empty", DS, b"", TEXT),
    Case("ds no content type", DS, b"x", {}),
    Case("ds content type mismatch", DS, b"{}", JSON),
    Case("ds no stream", DS.replace("/p", "/nope"), b"x", TEXT),
    Case("ds oversized", DS, OVER, TEXT),
    Case("ds unauthenticated", DS, b"x", TEXT, None),
    Case("ds read-only token", DS, b"x", TEXT, READER),
    Case("ds close", DS, b"last", {**TEXT, "stream-closed": "true"}),
    Case("ds close again", DS, b"", {**TEXT, "stream-closed": "true"}),
    Case("ds after close", DS, b"late", TEXT),
    Case("ds after close, other type", DS, b"{}", JSON),
]


async def _started(front: bool) -> AsyncIterator[AsyncTestClient[Litestar]]:
    container = memory_container()
    tokens = container.tokens()
    await IssueToken(tokens)(make_caller("default", "writer", list(SCOPES)), WRITER)
    await IssueToken(tokens)(make_caller("default", "reader", ["streams:read"]), READER)
    async with AsyncTestClient(app=create_app(container, front=front)) as client:
        auth = {"authorization": f"Bearer {WRITER}"}
        created = await client.post(
            "/api/workflow-streams/runs/r/streams",
            json={"stream_id": "s", "direction": "output"},
            headers=auth,
        )
        assert created.status_code == 201, created.text
        for path, kind in ((DS, "text/plain"), (DS_DEFAULT_RUN, "application/json")):
            created = await client.put(path, headers={**auth, "content-type": kind})
            assert created.status_code == 201, created.text
        yield client


async def _raw_post(
    app: Any, path: str, headers: list[tuple[bytes, bytes]], body: bytes
) -> tuple[int, list[tuple[str, str]], bytes]:
    """A POST straight into the ASGI application, its headers exactly as given."""
    headers = [(b"host", b"testserver"), (b"content-length", b"%d" % len(body)), *headers]
    scope = http_scope("POST", path, headers)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = sent[0]
    answer = sorted((n.decode("latin-1"), v.decode("latin-1")) for n, v in start["headers"])
    content = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], answer, content


@pytest.fixture
async def with_front() -> AsyncIterator[AsyncTestClient[Litestar]]:
    async for client in _started(True):
        yield client


@pytest.fixture
async def through_litestar() -> AsyncIterator[AsyncTestClient[Litestar]]:
    async for client in _started(False):
        yield client


def _positions(answer: tuple[int, list[tuple[str, str]], bytes]) -> Any:
    """The answer with each offset's position alone; each offset states an incarnation."""
    status, headers, body = answer
    for name, value in headers:
        if name == "stream-next-offset":
            assert value[:16].isdigit() and int(value[:16]) > 0, value
    return status, [(n, v[17:] if n == "stream-next-offset" else v) for n, v in headers], body


# Building the application in process reports Litestar's deprecation of inferred path
# parameters for every route; not what this test is about.
@pytest.mark.filterwarnings(
    "ignore::litestar.exceptions.base_exceptions.LitestarDeprecationWarning"
)
async def test_every_append_is_answered_alike_by_the_front_and_by_litestar(
    with_front: AsyncTestClient[Litestar], through_litestar: AsyncTestClient[Litestar]
) -> None:
    statuses = set()
    for number, case in enumerate(TABLE):
        given = {**case.headers, "x-request-id": f"case-{number}"}
        if case.token is not None:
            given["authorization"] = f"Bearer {case.token}"
        if case.repeated:  # sent as they are (the test client would join them with ", ")
            raw = [(n.encode(), v.encode()) for n, v in given.items()] + [
                (n.encode(), v) for n, v in case.repeated
            ]
            front, litestar = [
                await _raw_post(client.app, case.path, raw, case.body)
                for client in (with_front, through_litestar)
            ]
        else:
            answers = [
                await client.post(case.path, content=case.body, headers=given)
                for client in (with_front, through_litestar)
            ]
            front, litestar = (
                (a.status_code, sorted(a.headers.multi_items()), a.content) for a in answers
            )
        # Each app has its own stream, created at its own time: the offsets' incarnations
        # (their first field) differ, their positions must not.
        front, litestar = _positions(front), _positions(litestar)
        assert front == litestar, case.name
        assert case.status in (None, front[0]), (case.name, front)
        statuses.add(front[0])
    # The table reaches every kind of answer it is meant to.
    assert {200, 201, 204, 400, 401, 403, 404, 409, 413, 415, 422} <= statuses
