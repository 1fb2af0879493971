"""The Durable Streams routes below /api/durable-streams: a stream's URL is
`/v1/stream/{streamID}` (run `default`) or `/v1/stream/{runID}/{streamID}`. Each method is
declared once per URL form (two operation ids) and handled by `protocol`, which is handed plain
values: the services, the caller, the path's parameters, the headers (`_plain`).

A route added below the surface (say, a subscription's) is one more handler here, and its
function in `protocol` (or a module beside it) taking the same plain values."""

from __future__ import annotations

import functools
from typing import Any
from urllib.parse import parse_qsl

from litestar import Controller, Request, delete, get, post, put
from litestar.openapi.spec import Operation
from litestar.types import ASGIApp

from application.access import Caller
from application.waiting import client_watched
from domain.definition import MAX_IDLE_SECONDS
from domain.ids import ID_PATTERN
from domain.producers import MAX_PRODUCER_ID_LENGTH, MAX_WRITER_SEQ_LENGTH
from entrypoints.container import Services
from entrypoints.durable_streams import protocol, wire
from entrypoints.edge.head import RequestHeaders
from entrypoints.edge.head_method import is_head
from entrypoints.edge.leaving import (
    ClientLeft,
    answer_to_nobody,
    answered_unless_client_leaves,
    unless_client_leaves,
)
from entrypoints.edge.paths import DURABLE_STREAMS_PREFIX, STREAM_PATH
from entrypoints.openapi import Answer, Header, Link, RequestBody, decimal_pattern, documented

ON_A_STREAM = ("unauthenticated", "invalid-input", "unavailable", "forbidden", "not-found")
ANY_JSON: dict[str, Any] = {"description": "Any JSON value: one message, or an array of them"}
NOT_EMPTY_JSON: dict[str, Any] = {
    "description": "Any JSON value: one message, or a non-empty array of them",
    "not": {"type": "array", "maxItems": 0},
}
# A stream carries the media type it was created with, any type: a body in JSON (a stream of
# application/json), or bytes in the stream's own type.
STREAM_BYTES: dict[str, Any] = {"type": "string", "format": "binary"}
SOME_BYTES: dict[str, Any] = {**STREAM_BYTES, "minLength": 1}
CREATE_BODY = RequestBody("*/*", content=((wire.JSON, ANY_JSON), ("*/*", STREAM_BYTES)))
# An append needs a body (a close, Stream-Closed: true, may have none), in the stream's type.
APPEND_BODY = RequestBody("*/*", content=((wire.JSON, NOT_EMPTY_JSON), ("*/*", SOME_BYTES)))
ID_TEXT = ID_PATTERN.removeprefix("^").removesuffix("$")
OFFSET_TEXT = "[0-9]{16}_[0-9]{16}"
OFFSET = {"type": "string", "pattern": f"^{OFFSET_TEXT}$"}
DECIMAL = {"type": "string", "pattern": decimal_pattern(wire.MAX_PRODUCER_INTEGER)}
# What `isprintable` keeps of ASCII, with no space at either end (header values are trimmed).
PRINTABLE = "[!-~](?:[ -~]{0,%d}[!-~])?"
NEXT_OFFSET = Header(
    "Stream-Next-Offset", "The offset after the stream's (or this read's) end", OFFSET
)
# A live=sse read says it in its control events instead.
READ_TO = Header(
    "Stream-Next-Offset", "The offset after this read's end (not on live=sse)", OFFSET, False
)
# Each event as the event-stream reader sees it: on live=sse, `data` carries the stream's bytes
# (a JSON array for application/json, text for text/*, base64 otherwise) and `control` the
# read's position (JSON). A stream created as text/event-stream reads as its own events.
SSE_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
    "oneOf": [
        {"properties": {"event": {"const": "data"}}, "required": ["event"]},
        {
            "properties": {
                "event": {"const": "control"},
                "data": {"contentMediaType": "application/json"},
            },
            "required": ["event"],
        },
        {
            "description": "an event of the stream's own (a stream of text/event-stream)",
            "properties": {"event": {"not": {"enum": ["data", "control"]}}},
        },
    ],
}
CLOSED = Header("Stream-Closed", "Present when the stream is closed", {"const": "true"}, False)
UP_TO_DATE = Header(
    "Stream-Up-To-Date", "This answer reaches the stream's head", {"const": "true"}, False
)
CURSOR = Header(
    "Stream-Cursor",
    "Echo as `cursor` on the next live read",
    {"type": "string", "pattern": "^[0-9]+$"},
    False,
)
ETAG = Header("ETag", "Validates this range of the stream", required=False)
PRODUCER_EPOCH = Header("Producer-Epoch", "The producer's epoch", DECIMAL, False)
PRODUCER_SEQ = Header("Producer-Seq", "The highest accepted seq of the epoch", DECIMAL, False)
CLOSE = Header(
    "Stream-Closed",
    "`true` (in any case) closes the stream (after this body); any other value is as if absent",
    {"type": "string"},
    False,
)
# Rules between parameters, which OpenAPI cannot state (each parameter has its own schema), said
# in their descriptions and in docs/http-api.md ("The OpenAPI document"): Stream-TTL or
# Stream-Expires-At, not both; Stream-Fork-Offset and Stream-Fork-Sub-Offset only with
# Stream-Forked-From, a sub-offset above 0 only with an offset; Producer-Id, Producer-Epoch and
# Producer-Seq all three or none; `live` only with `offset`.
THE_STREAM = {"stream_id": "$request.path.stream_id"}
IN_THE_RUN = {"run_id": "$request.path.run_id", **THE_STREAM}


def _documented_create(
    read: str, append: str, delete: str, where: dict[str, str]
) -> type[Operation]:
    """A create's declarations; its 201 leads to the stream it made, at the same URL."""
    return documented(
        Answer(
            201,
            "Created; the answer's Content-Type is the stream's",
            headers=(NEXT_OFFSET, CLOSED, Header("Location", "The stream's URL")),
            links=tuple(Link(operation, where) for operation in (read, append, delete)),
        ),
        Answer(200, "It exists with this configuration", headers=(NEXT_OFFSET, CLOSED)),
        problems=(
            *ON_A_STREAM,
            "definition-conflict",
            "quota-exhausted",
            "request-too-large",
            "record-too-large",
        ),
        request_body=CREATE_BODY,
        request_headers=(
            Header(
                "Stream-TTL",
                "Sliding expiry in seconds (not with Stream-Expires-At)",
                {"type": "string", "pattern": decimal_pattern(MAX_IDLE_SECONDS, minimum=1)},
                False,
            ),
            Header(
                "Stream-Expires-At",
                "Absolute expiry, RFC 3339 with its offset, in the future (not with Stream-TTL)",
                {"type": "string", "format": "date-time"},
                False,
            ),
            Header(
                "Stream-Closed", "`true` (any case): create it closed", {"type": "string"}, False
            ),
            Header(
                "Stream-Forked-From",
                "Fork the stream at this path (below the mount)",
                {"type": "string", "pattern": f"^/v1/stream/(?:{ID_TEXT}/)?{ID_TEXT}$"},
                False,
            ),
            Header(
                "Stream-Fork-Offset",
                "Where the fork diverges: a returned offset, or -1 (with Stream-Forked-From)",
                {"type": "string", "pattern": f"^(?:-1|{OFFSET_TEXT})$"},
                False,
            ),
            Header(
                "Stream-Fork-Sub-Offset",
                "Messages or bytes past the offset (with Stream-Forked-From; if not 0, an offset)",
                DECIMAL,
                False,
            ),
        ),
    )


_CREATE_ONE = _documented_create("dsRead", "dsAppend", "dsDelete", THE_STREAM)
_CREATE_IN_RUN = _documented_create("dsReadInRun", "dsAppendInRun", "dsDeleteInRun", IN_THE_RUN)
_APPEND = documented(
    Answer(
        204,
        "Appended (or closed; or a producer's retry)",
        headers=(NEXT_OFFSET, CLOSED, PRODUCER_EPOCH, PRODUCER_SEQ),
    ),
    Answer(
        200,
        "Appended by an idempotent producer",
        headers=(NEXT_OFFSET, CLOSED, PRODUCER_EPOCH, PRODUCER_SEQ),
    ),
    problems=(
        *ON_A_STREAM,
        "stream-closed",
        "definition-conflict",
        "stream-seq-regression",
        "producer-epoch-stale",
        "producer-sequence-gap",
        "backpressure",
        "quota-exhausted",
        "record-too-large",
        "request-too-large",
        "stream-gone",
    ),
    request_body=APPEND_BODY,
    request_headers=(
        CLOSE,
        Header(
            "Stream-Seq",
            "Writer sequence: byte-wise above the last one",
            {"type": "string", "pattern": f"^{PRINTABLE % (MAX_WRITER_SEQ_LENGTH - 2)}$"},
            False,
        ),
        Header(
            "Producer-Id",
            "Idempotent producer (with Producer-Epoch and Producer-Seq)",
            {"type": "string", "pattern": f"^{PRINTABLE % (MAX_PRODUCER_ID_LENGTH - 2)}$"},
            False,
        ),
        Header("Producer-Epoch", "The producer's epoch (with Producer-Id)", DECIMAL, False),
        Header("Producer-Seq", "The producer's batch number (with Producer-Id)", DECIMAL, False),
    ),
)
_READ = documented(
    Answer(
        200,
        "The stream's bytes in its own media type (a JSON array for application/json; "
        "events for live=sse)",
        content=(
            (wire.JSON, {"type": "array"}),
            ("text/event-stream", SSE_EVENT),
            ("*/*", STREAM_BYTES),
        ),
        headers=(READ_TO, UP_TO_DATE, CLOSED, CURSOR, ETAG),
    ),
    Answer(
        204,
        "Long-poll: nothing new in time, or closed at the end",
        headers=(NEXT_OFFSET, UP_TO_DATE, CLOSED, CURSOR),
    ),
    Answer(304, "Not modified (If-None-Match)"),
    problems=(
        *ON_A_STREAM,
        "cursor-ahead-of-head",
        "cursor-expired",
        "egress-region-denied",
        "stream-gone",
        "too-many-subscriptions",  # live=sse and a waiting live=long-poll are live connections
    ),
    query=(
        Header(
            "offset",
            "Read from here: an offset the server returned, -1 (the start) or now (the head)",
            {"type": "string", "pattern": f"^(?:-1|now|{OFFSET_TEXT})$"},
            False,
        ),
        Header("live", "Wait for records (with an offset)", {"enum": ["long-poll", "sse"]}, False),
        Header("cursor", "The last Stream-Cursor answered", {"type": "string"}, False),
    ),
)
_DELETE = documented(
    Answer(204, "Deleted"),
    problems=(*ON_A_STREAM, "legal-hold-active", "stream-gone"),
)

ONE = "/{stream_id:str}"
IN_RUN = "/{run_id:str}/{stream_id:str}"


async def _plain(request: Request) -> tuple[Services, Caller, protocol.Where, RequestHeaders]:
    """What a protocol function is handed of a request: the services, the request's caller
    (authenticated before anything else), where it goes, and its headers."""
    services: Services = request.app.state.services
    headers = RequestHeaders(request.scope["headers"])
    caller = await services.authenticate(headers.get("authorization"))
    return services, caller, protocol.where(request.path_params), headers


async def _create(request: Request) -> ASGIApp:
    services, caller, at, headers = await _plain(request)
    scope = request.scope
    origin = protocol.Origin(scope.get("scheme", "http"), scope.get("server"))
    return await protocol.create(services, caller, at, headers, request.body, origin)


async def _append(request: Request) -> ASGIApp:
    services, caller, at, headers = await _plain(request)
    try:
        # A write waiting for credit (`block`) ends if its client leaves (as entrypoints/
        # front.py answers this route).
        with client_watched(functools.partial(unless_client_leaves, request.receive)):
            return await protocol.append(services, caller, at, headers, request.body)
    except ClientLeft:
        return answer_to_nobody


async def _read(request: Request) -> ASGIApp:
    services, caller, at, headers = await _plain(request)
    query_string = request.scope.get("query_string", b"")
    read = protocol.read(
        services,
        caller,
        at,
        headers,
        query_string,
        head_only=is_head(request.scope),
        long_poll_seconds=request.app.state.long_poll_seconds,
    )
    if not _long_poll(query_string):
        answer: ASGIApp = await read
        return answer
    # A long-poll ends when its client leaves (entrypoints/edge/leaving.py).
    return await answered_unless_client_leaves(request.receive, read)


def _long_poll(query_string: bytes) -> bool:
    """Whether the read is a long-poll (never an event stream: it watches its client itself)."""
    if b"long-poll" not in query_string:
        return False  # (every read but a long-poll, without parsing)
    lives = [v for k, v in parse_qsl(query_string.decode("latin-1")) if k == "live"]
    return lives == ["long-poll"]


async def _erase(request: Request) -> None:
    services, caller, at, _ = await _plain(request)
    await protocol.erase(services, caller, at)


class DurableStreamsController(Controller):
    path = DURABLE_STREAMS_PREFIX + STREAM_PATH
    tags = ["durable-streams"]

    @put(
        ONE,
        operation_id="dsCreate",
        summary="Create a stream (run default)",
        operation_class=_CREATE_ONE,
    )
    async def create_one(self, request: Request) -> ASGIApp:
        return await _create(request)

    @put(
        IN_RUN,
        operation_id="dsCreateInRun",
        summary="Create a stream",
        operation_class=_CREATE_IN_RUN,
    )
    async def create_in_run(self, request: Request) -> ASGIApp:
        return await _create(request)

    @post(
        ONE, operation_id="dsAppend", summary="Append, close (run default)", operation_class=_APPEND
    )
    async def append_one(self, request: Request) -> ASGIApp:
        return await _append(request)

    @post(IN_RUN, operation_id="dsAppendInRun", summary="Append, close", operation_class=_APPEND)
    async def append_in_run(self, request: Request) -> ASGIApp:
        return await _append(request)

    @get(ONE, operation_id="dsRead", summary="Read (run default)", operation_class=_READ)
    async def read_one(self, request: Request) -> ASGIApp:
        return await _read(request)

    @get(IN_RUN, operation_id="dsReadInRun", summary="Read", operation_class=_READ)
    async def read_in_run(self, request: Request) -> ASGIApp:
        return await _read(request)

    @delete(
        ONE,
        operation_id="dsDelete",
        summary="Delete (run default)",
        status_code=204,
        operation_class=_DELETE,
    )
    async def delete_one(self, request: Request) -> None:
        await _erase(request)

    @delete(
        IN_RUN,
        operation_id="dsDeleteInRun",
        summary="Delete",
        status_code=204,
        operation_class=_DELETE,
    )
    async def delete_in_run(self, request: Request) -> None:
        await _erase(request)
