"""The Durable Streams routes below /api/durable-streams: a stream's URL is
`/v1/stream/{streamID}` (run `default`) or `/v1/stream/{runID}/{streamID}`. Each method is
declared once per URL form (two operation ids) and handled by `protocol`."""

from __future__ import annotations

from litestar import Controller, Request, delete, get, post, put
from litestar.types import ASGIApp

from entrypoints.durable_streams import protocol
from entrypoints.http.openapi import Answer, Header, RequestBody, documented

ON_A_STREAM = ("unauthenticated", "invalid-input", "unavailable", "forbidden", "not-found")
ANY_BODY = RequestBody("*/*", schema={"type": "string", "format": "binary"})
OFFSET = {"type": "string"}
NEXT_OFFSET = Header("Stream-Next-Offset", "The offset after the stream's (or this read's) end")
CLOSED = Header("Stream-Closed", "Present when the stream is closed", {"const": "true"}, False)
UP_TO_DATE = Header(
    "Stream-Up-To-Date", "This answer reaches the stream's head", {"const": "true"}, False
)
CURSOR = Header(
    "Stream-Cursor", "Echo as `cursor` on the next live read", {"type": "string"}, False
)
ETAG = Header("ETag", "Validates this range of the stream", required=False)
PRODUCER_EPOCH = Header("Producer-Epoch", "The producer's epoch", {"type": "string"}, False)
PRODUCER_SEQ = Header(
    "Producer-Seq", "The highest accepted seq of the epoch", {"type": "string"}, False
)
STREAM_BYTES = {"type": "string", "format": "binary"}

_CREATE = documented(
    Answer(201, "Created", headers=(NEXT_OFFSET, CLOSED, Header("Location", "The stream's URL"))),
    Answer(200, "It exists with this configuration", headers=(NEXT_OFFSET, CLOSED)),
    problems=(*ON_A_STREAM, "definition-conflict", "request-too-large", "record-too-large"),
    request_body=ANY_BODY,
    request_headers=(
        Header("Stream-TTL", "Sliding expiry in seconds", {"type": "string"}, False),
        Header("Stream-Expires-At", "Absolute expiry (RFC 3339)", {"type": "string"}, False),
        Header("Stream-Closed", "Create it closed", {"type": "string"}, False),
        Header("Stream-Forked-From", "Fork this stream's path", {"type": "string"}, False),
        Header("Stream-Fork-Offset", "Where the fork diverges", {"type": "string"}, False),
        Header(
            "Stream-Fork-Sub-Offset",
            "Past the offset: messages or bytes",
            {"type": "string"},
            False,
        ),
    ),
)
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
    request_body=ANY_BODY,
    request_headers=(
        Header("Stream-Closed", "Close the stream (after this body)", {"type": "string"}, False),
        Header(
            "Stream-Seq", "Writer sequence: byte-wise above the last one", {"type": "string"}, False
        ),
        Header("Producer-Id", "Idempotent producer", {"type": "string"}, False),
        Header("Producer-Epoch", "The producer's epoch", {"type": "string"}, False),
        Header("Producer-Seq", "The producer's batch number", {"type": "string"}, False),
    ),
)
_READ = documented(
    Answer(
        200,
        "The stream's bytes (a JSON array for application/json; events for live=sse)",
        media_type="application/octet-stream",
        schema=STREAM_BYTES,
        headers=(NEXT_OFFSET, UP_TO_DATE, CLOSED, CURSOR, ETAG),
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
)
_DELETE = documented(
    Answer(204, "Deleted"),
    problems=(*ON_A_STREAM, "legal-hold-active", "stream-gone"),
)

ONE = "/{stream_id:str}"
IN_RUN = "/{run_id:str}/{stream_id:str}"


class DurableStreamsController(Controller):
    path = protocol.PREFIX + protocol.STREAM_PATH
    tags = ["durable-streams"]

    @put(
        ONE,
        operation_id="dsCreate",
        summary="Create a stream (run default)",
        operation_class=_CREATE,
    )
    async def create_one(self, request: Request) -> ASGIApp:
        return await protocol.create(request)

    @put(IN_RUN, operation_id="dsCreateInRun", summary="Create a stream", operation_class=_CREATE)
    async def create_in_run(self, request: Request) -> ASGIApp:
        return await protocol.create(request)

    @post(
        ONE, operation_id="dsAppend", summary="Append, close (run default)", operation_class=_APPEND
    )
    async def append_one(self, request: Request) -> ASGIApp:
        return await protocol.append(request)

    @post(IN_RUN, operation_id="dsAppendInRun", summary="Append, close", operation_class=_APPEND)
    async def append_in_run(self, request: Request) -> ASGIApp:
        return await protocol.append(request)

    @get(ONE, operation_id="dsRead", summary="Read (run default)", operation_class=_READ)
    async def read_one(self, request: Request) -> ASGIApp:
        return await protocol.read(request)

    @get(IN_RUN, operation_id="dsReadInRun", summary="Read", operation_class=_READ)
    async def read_in_run(self, request: Request) -> ASGIApp:
        return await protocol.read(request)

    @delete(
        ONE,
        operation_id="dsDelete",
        summary="Delete (run default)",
        status_code=204,
        operation_class=_DELETE,
    )
    async def delete_one(self, request: Request) -> None:
        await protocol.erase(request)

    @delete(
        IN_RUN,
        operation_id="dsDeleteInRun",
        summary="Delete",
        status_code=204,
        operation_class=_DELETE,
    )
    async def delete_in_run(self, request: Request) -> None:
        await protocol.erase(request)
