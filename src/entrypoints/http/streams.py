"""The stream routes: thin handlers, one use case each.

Handlers take the request, read the use cases built at start-up from the application state and
authenticate inline, rather than through Litestar dependencies: resolving two dependencies per
request cost about 15% of an append's CPU when measured (bench: 4.0k -> 4.7k appends/s)."""

from __future__ import annotations

import functools
from typing import Annotated

import msgspec
from litestar import Controller, Request, Response, delete, get, post, put
from litestar.params import FromPath, Parameter
from litestar.types import ASGIApp

from application import waiting
from application.access import Caller
from application.consumers import DEFAULT_LIMIT as CONSUMERS_LIMIT
from application.consumers import MAX_LIMIT as MAX_CONSUMERS_LIMIT
from application.consumers import ConsumerList
from application.list_runs import DEFAULT_LIMIT, MAX_LIMIT, RunList
from application.list_streams import DEFAULT_LIMIT as DEFAULT_STREAMS_LIMIT
from application.list_streams import MAX_LIMIT as MAX_STREAMS_LIMIT
from application.views import (
    AckAnswer,
    AppendAnswer,
    LegalHoldView,
    RecordsPage,
    StreamDocument,
    StreamList,
)
from application.waiting import client_watched
from domain.definition import MAX_BATCH_RECORDS, MAX_SEQUENCE, DefinitionRequest
from domain.digits import bounded_integer
from domain.errors import InvalidInput
from domain.ids import ID_PATTERN
from entrypoints.container import Services
from entrypoints.edge.head import RequestHead
from entrypoints.edge.head_method import is_head
from entrypoints.edge.leaving import (
    ClientLeft,
    answer_to_nobody,
    answered_unless_client_leaves,
    unless_client_leaves,
)
from entrypoints.http import appends
from entrypoints.http.answers import EncodedJsonAnswer, HeadersAnswer
from entrypoints.http.body import decode_body
from entrypoints.http.schemas import AckBody, AppendBody, LegalHoldBody
from entrypoints.openapi import Answer, Header, Link, RequestBody, documented
from entrypoints.sse.asgi import EventStreamResponse
from entrypoints.sse.events import event_stream

API_PREFIX = "/api/workflow-streams"
STREAM = "/{stream_id:str}"
_REPLAYED = ((b"idempotent-replayed", b"true"),)
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]

# The problems a route below the prefix may answer, whatever it does: no or an unknown token,
# an ID that does not match the pattern, PostgreSQL out of reach.
EVERY_ROUTE = ("unauthenticated", "invalid-input", "unavailable")
# A route on one stream adds the caller's permission, the stream's existence and its placement.
ON_A_STREAM = (*EVERY_ROUTE, "forbidden", "not-found", "misdirected")
# One that delivers records or bodies also checks the stream's client egress regions.
DELIVERING = (*ON_A_STREAM, "egress-region-denied")
# One that reads a JSON body refuses one over the request size limit.
WITH_A_BODY = ("request-too-large",)
LOCATION = Header("Location", "The stream's URL")
_THE_STREAM = {"run_id": "$request.path.run_id", "stream_id": "$response.body#/stream_id"}
# An acknowledgement creates its consumer (the first time): it is listed, and may be removed.
_THE_STREAM_ASKED = {"run_id": "$request.path.run_id", "stream_id": "$request.path.stream_id"}
_CONSUMER = "$request.path.consumer_id"
TO_THE_STREAM = tuple(
    Link(operation, _THE_STREAM)
    for operation in (
        "getStream",
        "appendRecords",
        "readRecords",
        "subscribe",
        "closeStream",
        "setLegalHold",
        "prepareObject",
        "deleteStream",
    )
)
# What check_idempotency_key takes, as header text (latin-1) arrives: printable characters
# (str.isprintable); spaces and tabs at either end are not part of a field value in HTTP.
_PRINTABLE = r"\x21-\x7e\xa1-\xac\xae-\xff"
IDEMPOTENCY_KEY = f"^[ \\t]*[{_PRINTABLE}](?:[ {_PRINTABLE}]{{0,253}}[{_PRINTABLE}])?[ \\t]*$"
REPLAYED = Header(
    "Idempotent-Replayed", "A retry answered from the first append", {"const": "true"}
)
Cursor = Annotated[
    int,
    Parameter(
        ge=0,
        le=MAX_SEQUENCE,
        description="exclusive: records with sequence > cursor",
        schema_extra={
            "maximum": MAX_SEQUENCE
        },  # Litestar writes bounds as floats: 2**63 - 1 is not one
    ),
]
# Each event as the event-stream reader sees it; `data` is JSON (a record, or the closing head, or
# the fields of a 410 when retention overtook the subscriber).
SSE_EVENT = {
    "type": "object",
    "oneOf": [
        {
            "properties": {
                "event": {"const": "record"},
                "id": {"type": "string", "pattern": "^[0-9]+$"},
                "data": {"type": "string", "contentMediaType": "application/json"},
            },
            "required": ["event", "id", "data"],
        },
        {
            "properties": {
                "event": {"enum": ["closed", "gone", "deleted"]},
                "data": {"type": "string", "contentMediaType": "application/json"},
            },
            "required": ["event", "data"],
        },
    ],
}


# The create body, with the rule between its fields that `check_input_ids` enforces: an input
# stream's ID holds no `:` (the separator of its events' ids).
CreateBody = Annotated[
    DefinitionRequest,
    msgspec.Meta(
        extra_json_schema={
            "if": {"properties": {"direction": {"const": "input"}}, "required": ["direction"]},
            "then": {"properties": {"stream_id": {"pattern": "^[^:]*$"}}},
        }
    ),
]


async def authenticated(request: Request) -> tuple[Services, Caller]:
    services: Services = request.app.state.services
    return services, await services.authenticate(request.headers.get("authorization"))


async def authenticated_reading_no_body(request: Request) -> tuple[Services, Caller]:
    """`authenticated`, for a route that never reads its body (a close, an object's commit or
    abort). A request whose head announces a body goes to work on its tenant's turn once the
    body is in (application/waiting.py, `body_arrived`); this one's body is only drained after
    its answer, so it goes to work now: else any token could run these on no turn at all."""
    answer = await authenticated(request)
    await waiting.body_arrived()
    return answer


class StreamsController(Controller):
    path = API_PREFIX + "/runs/{run_id:str}/streams"
    tags = ["streams"]

    @post(
        "",
        operation_id="createStream",
        summary="Create a stream definition",
        operation_class=documented(
            Answer(201, "Created", StreamDocument, headers=(LOCATION,), links=TO_THE_STREAM),
            Answer(
                200,
                "The same definition again: the stream as it is",
                StreamDocument,
                headers=(LOCATION,),
                links=TO_THE_STREAM,
            ),
            problems=(
                *EVERY_ROUTE,
                *WITH_A_BODY,
                "forbidden",
                "misdirected",
                "definition-conflict",
                "content-class-forbidden",
                "quota-exhausted",
            ),
            request_body=RequestBody("application/json", CreateBody),
        ),
    )
    async def create_stream(
        self, request: Request, run_id: FromPath[str]
    ) -> Response[StreamDocument]:
        services, caller = await authenticated(request)
        definition = await decode_body(request, DefinitionRequest)
        document, created = await services.create_stream(caller, run_id, definition)
        location = f"{API_PREFIX}/runs/{run_id}/streams/{document.stream_id}"
        return Response(
            document, status_code=201 if created else 200, headers={"Location": location}
        )

    @get(
        "",
        operation_id="listStreams",
        summary="List a run's streams",
        operation_class=documented(
            Answer(
                200,
                "The run's streams after `after` this caller may read, ascending by stream_id",
                StreamList,
            ),
            problems=(*EVERY_ROUTE, "forbidden", "not-found"),
        ),
    )
    async def list_streams(
        self,
        request: Request,
        run_id: FromPath[str],
        limit: Annotated[
            int, Parameter(ge=1, le=MAX_STREAMS_LIMIT, description="at most this many streams")
        ] = DEFAULT_STREAMS_LIMIT,
        after: Annotated[
            str | None,
            Parameter(
                description="exclusive: streams whose stream_id follows this one (`next_after`)",
                pattern=ID_PATTERN,
            ),
        ] = None,
    ) -> StreamList:
        services, caller = await authenticated(request)
        return await services.list_streams(caller, run_id, after, limit)

    @get(
        STREAM,
        operation_id="getStream",
        summary="Read a stream's definition and state",
        operation_class=documented(
            Answer(200, "The stream document", StreamDocument), problems=ON_A_STREAM
        ),
    )
    async def get_stream(
        self, request: Request, run_id: FromPath[str], stream_id: FromPath[str]
    ) -> StreamDocument:
        services, caller = await authenticated(request)
        return await services.get_stream(caller, run_id, stream_id)

    @post(
        STREAM + "/records",
        operation_id="appendRecords",
        summary="Append records",
        operation_class=documented(
            Answer(201, "Appended", AppendAnswer),
            Answer(
                200,
                "A retry with the same key and body: the first answer",
                AppendAnswer,
                headers=(REPLAYED,),
            ),
            problems=(
                *ON_A_STREAM,
                *WITH_A_BODY,
                "record-too-large",
                "backpressure",
                "quota-exhausted",
                "stream-closed",
                "idempotency-key-reused",
            ),
            request_body=AppendBody,
            request_headers=(
                Header(
                    "Idempotency-Key",
                    "Makes a retry of this append safe: 1 to 255 printable characters",
                    {"type": "string", "pattern": IDEMPOTENCY_KEY},
                    required=False,
                ),
            ),
        ),
    )
    async def append_records(self, request: Request) -> ASGIApp:
        # The hottest route reads its path parameters and headers itself and answers through
        # JsonAnswer: Litestar's per-parameter extraction, header parsing and response pipeline
        # cost about a quarter of an append (bench: 3.2k -> 3.6k/s for the parameters alone).
        params = request.path_params
        head = RequestHead(request.scope["headers"])
        services: Services = request.app.state.services
        caller = await services.authenticate(head.authorization)
        try:
            # An append waiting for credit (`block`) ends if its client leaves (entrypoints/
            # front.py answers this route the same way).
            with client_watched(functools.partial(unless_client_leaves, request.receive)):
                return await appends.append(
                    services,
                    caller,
                    params["run_id"],
                    params["stream_id"],
                    await request.body(),
                    head.idempotency_key,
                )
        except ClientLeft:
            return answer_to_nobody

    @get(
        STREAM + "/records",
        operation_id="readRecords",
        summary="Read records after a cursor",
        operation_class=documented(
            Answer(200, "The records after the cursor, ascending", RecordsPage),
            problems=(
                *DELIVERING,
                "cursor-ahead-of-head",
                "cursor-expired",
                "too-many-subscriptions",  # a read that waits is a live connection
            ),
        ),
    )
    async def read_records(
        self,
        request: Request,
        run_id: FromPath[str],
        stream_id: FromPath[str],
        cursor: Cursor = 0,
        limit: Annotated[
            int, Parameter(ge=1, le=MAX_BATCH_RECORDS, description="at most this many records")
        ] = 100,
        wait: Annotated[
            float,
            Parameter(ge=0, le=60, description="seconds to wait for an append when none is new"),
        ] = 0,
    ) -> ASGIApp:
        services, caller = await authenticated(request)
        # The page's JSON written in one pass, without a view per record: about a third of a
        # catch-up's server CPU per record (docs/architecture.md "Catch-up reads").
        read = services.read_records.stored(caller, run_id, stream_id, cursor, limit, wait)

        async def answer() -> ASGIApp:
            return EncodedJsonAnswer((await read).json())

        if not wait:
            return await answer()
        # A read that waits ends when its client leaves (entrypoints/edge/leaving.py).
        return await answered_unless_client_leaves(request.receive, answer())

    @get(
        STREAM + "/subscribe",
        operation_id="subscribe",
        summary="Follow records live (SSE)",
        operation_class=documented(
            Answer(
                200,
                "Events `record` (id: the sequence), then `closed`, `gone` or `deleted` "
                "(data `{}`: the stream was deleted); comment lines while idle",
                media_type="text/event-stream",
                schema=SSE_EVENT,
            ),
            problems=(
                *DELIVERING,
                "cursor-ahead-of-head",
                "cursor-expired",
                "too-many-subscriptions",
            ),
            request_headers=(
                Header(
                    "Last-Event-ID",
                    "The last sequence received: it takes precedence over `cursor`",
                    {"type": "integer", "minimum": 0, "maximum": MAX_SEQUENCE},
                    required=False,
                ),
            ),
        ),
    )
    async def subscribe(
        self, request: Request, run_id: FromPath[str], stream_id: FromPath[str], cursor: Cursor = 0
    ) -> ASGIApp:
        services, caller = await authenticated(request)
        last_event_id = request.headers.get("last-event-id")
        if last_event_id is not None:
            sequence = bounded_integer(last_event_id.strip(" \t"), MAX_SEQUENCE)
            if sequence is None:
                raise InvalidInput(
                    f"Last-Event-ID must be a record sequence (0 to {MAX_SEQUENCE})",
                    field="Last-Event-ID",
                )
            cursor = sequence
        if is_head(request.scope):
            # What a subscription would answer, and nothing followed: no slot is held.
            await services.subscribe.check(caller, run_id, stream_id, cursor)
            return HeadersAnswer(200, SSE_HEADERS)
        subscription = await services.subscribe(caller, run_id, stream_id, cursor)
        return EventStreamResponse(event_stream(subscription), SSE_HEADERS)

    @post(
        STREAM + "/consumers/{consumer_id:str}/ack",
        operation_id="acknowledge",
        summary="Acknowledge a consumer's progress",
        status_code=200,
        operation_class=documented(
            Answer(
                200,
                "The consumer's acknowledgement and the stream's credit",
                AckAnswer,
                links=(
                    Link("listConsumers", _THE_STREAM_ASKED),
                    Link("deleteConsumer", {**_THE_STREAM_ASKED, "consumer_id": _CONSUMER}),
                ),
            ),
            problems=(
                *ON_A_STREAM,
                *WITH_A_BODY,
                "ack-regression",
                "ack-ahead-of-head",
                "cross-scope-ack",
                "too-many-consumers",
            ),
            request_body=AckBody,
        ),
    )
    async def acknowledge(
        self,
        request: Request,
        run_id: FromPath[str],
        stream_id: FromPath[str],
        consumer_id: FromPath[str],
    ) -> AckAnswer:
        services, caller = await authenticated(request)
        body = await decode_body(request, AckBody)
        return await services.acknowledge(caller, run_id, stream_id, consumer_id, body.sequence)

    @get(
        STREAM + "/consumers",
        operation_id="listConsumers",
        summary="List a stream's consumers",
        operation_class=documented(
            Answer(200, "The consumers after `after`, ascending by consumer_id", ConsumerList),
            problems=ON_A_STREAM,
        ),
    )
    async def list_consumers(
        self,
        request: Request,
        run_id: FromPath[str],
        stream_id: FromPath[str],
        limit: Annotated[
            int, Parameter(ge=1, le=MAX_CONSUMERS_LIMIT, description="at most this many consumers")
        ] = CONSUMERS_LIMIT,
        after: Annotated[
            str | None,
            Parameter(
                description="exclusive: consumers whose consumer_id follows this one "
                "(`next_after`)",
                pattern=ID_PATTERN,
            ),
        ] = None,
    ) -> ConsumerList:
        services, caller = await authenticated(request)
        return await services.list_consumers(caller, run_id, stream_id, after, limit)

    @delete(
        STREAM + "/consumers/{consumer_id:str}",
        operation_id="deleteConsumer",
        summary="Remove a consumer (releases what it held back)",
        status_code=204,
        operation_class=documented(
            Answer(204, "Removed: credit no longer counts it; its ID may be created again"),
            problems=ON_A_STREAM,
        ),
    )
    async def delete_consumer(
        self,
        request: Request,
        run_id: FromPath[str],
        stream_id: FromPath[str],
        consumer_id: FromPath[str],
    ) -> None:
        services, caller = await authenticated(request)
        await services.delete_consumer(caller, run_id, stream_id, consumer_id)

    @post(
        STREAM + "/close",
        operation_id="closeStream",
        summary="Close a stream",
        status_code=200,
        operation_class=documented(
            Answer(200, "The stream document (closing again changes nothing)", StreamDocument),
            problems=ON_A_STREAM,
        ),
    )
    async def close_stream(
        self, request: Request, run_id: FromPath[str], stream_id: FromPath[str]
    ) -> StreamDocument:
        services, caller = await authenticated_reading_no_body(request)
        return await services.close_stream(caller, run_id, stream_id)

    @put(
        STREAM + "/legal-hold",
        operation_id="setLegalHold",
        summary="Set the legal hold",
        operation_class=documented(
            Answer(200, "The legal hold", LegalHoldView),
            problems=(*ON_A_STREAM, *WITH_A_BODY),
            request_body=LegalHoldBody,
        ),
    )
    async def set_legal_hold(
        self, request: Request, run_id: FromPath[str], stream_id: FromPath[str]
    ) -> LegalHoldView:
        services, caller = await authenticated(request)
        body = await decode_body(request, LegalHoldBody)
        return await services.set_legal_hold(caller, run_id, stream_id, body.enabled, body.reason)

    @delete(
        STREAM,
        operation_id="deleteStream",
        summary="Delete (erase) a stream",
        status_code=204,
        operation_class=documented(
            Answer(204, "Erased: every route for the stream answers 404 from now on"),
            problems=(*ON_A_STREAM, "legal-hold-active"),
        ),
    )
    async def delete_stream(
        self, request: Request, run_id: FromPath[str], stream_id: FromPath[str]
    ) -> None:
        services, caller = await authenticated(request)
        await services.delete_stream(caller, run_id, stream_id)


class RunsController(Controller):
    path = API_PREFIX + "/runs"
    tags = ["runs"]

    @get(
        "",
        operation_id="listRuns",
        summary="List the tenant's runs",
        operation_class=documented(
            Answer(200, "The runs after `after`, ascending by run_id", RunList),
            problems=(*EVERY_ROUTE, "forbidden"),
        ),
    )
    async def list_runs(
        self,
        request: Request,
        limit: Annotated[
            int, Parameter(ge=1, le=MAX_LIMIT, description="at most this many runs")
        ] = DEFAULT_LIMIT,
        after: Annotated[
            str | None,
            Parameter(
                description="exclusive: runs whose run_id follows this one (`next_after`)",
                pattern=ID_PATTERN,
            ),
        ] = None,
        prefix: Annotated[
            str | None,
            Parameter(
                description="only the runs whose run_id starts with this",
                pattern=ID_PATTERN,
            ),
        ] = None,
    ) -> RunList:
        services, caller = await authenticated(request)
        return await services.list_runs(caller, after, limit, prefix or "")

    @delete(
        "/{run_id:str}",
        operation_id="deleteRun",
        summary="Delete (erase) every stream of a run, all or nothing",
        status_code=204,
        operation_class=documented(
            Answer(204, "Every stream of the run is erased"),
            problems=(*EVERY_ROUTE, "forbidden", "not-found", "misdirected", "legal-hold-active"),
        ),
    )
    async def delete_run(self, request: Request, run_id: FromPath[str]) -> None:
        services, caller = await authenticated(request)
        await services.delete_run(caller, run_id)
