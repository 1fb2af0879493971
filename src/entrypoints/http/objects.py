"""The object routes: prepare, upload (streamed), commit, abort, metadata and download."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Annotated

import msgspec
from litestar import Controller, Request, Response, get, post, put
from litestar.params import FromPath, Parameter
from litestar.response import Stream

from application.objects import (
    DEFAULT_OBJECTS_LIMIT,
    MAX_OBJECTS_LIMIT,
    CommitAnswer,
    ObjectView,
)
from application.views import ObjectList
from domain.definition import MAX_OBJECT_BYTES
from domain.digits import bounded_integer
from domain.errors import ObjectTooLarge
from domain.ids import ID_PATTERN
from domain.objects import ObjectRequest
from entrypoints.edge.head_method import is_head
from entrypoints.http import problems
from entrypoints.http.body import decode_body
from entrypoints.http.ranges import NotSatisfiable, Span, byte_span
from entrypoints.http.streams import (
    API_PREFIX,
    DELIVERING,
    ON_A_STREAM,
    WITH_A_BODY,
    authenticated,
    authenticated_reading_no_body,
)
from entrypoints.openapi import Answer, Header, Link, RequestBody, documented

OBJECT = "/{object_id:str}"
LOCATION = Header("Location", "The object's URL")
_THE_OBJECT = {
    "run_id": "$request.path.run_id",
    "stream_id": "$request.path.stream_id",
    "object_id": "$response.body#/object_id",
}
TO_THE_OBJECT = tuple(
    Link(operation, _THE_OBJECT)
    for operation in (
        "uploadObjectBody",
        "commitObject",
        "abortObject",
        "getObject",
        "getObjectBody",
    )
)
BYTES = {"type": "string", "format": "binary"}
BODY_HEADERS = (
    Header("Repr-Digest", "The whole body's SHA-256: sha-256=:<base64>:"),
    Header("ETag", "The body's entity tag (its SHA-256 in hex, quoted)"),
    Header("Accept-Ranges", "bytes", {"const": "bytes"}),
    Header("Content-Length", "The bytes in this answer", {"type": "integer", "minimum": 0}),
)


class ObjectsController(Controller):
    path = API_PREFIX + "/runs/{run_id:str}/streams/{stream_id:str}/objects"
    tags = ["objects"]

    @post(
        "",
        operation_id="prepareObject",
        summary="Prepare an object intent",
        operation_class=documented(
            Answer(
                201,
                "Prepared: upload the body to `upload.url`",
                ObjectView,
                headers=(LOCATION,),
                links=TO_THE_OBJECT,
            ),
            Answer(
                200,
                "The same idempotency key and fields again: the intent as it is",
                ObjectView,
                headers=(LOCATION,),
                links=TO_THE_OBJECT,
            ),
            problems=(
                *ON_A_STREAM,
                *WITH_A_BODY,
                "stream-closed",
                "idempotency-key-reused",
                "quota-exhausted",
                "too-many-open-objects",
                "object-too-large",
            ),
            request_body=ObjectRequest,
        ),
    )
    async def prepare(
        self, request: Request, run_id: FromPath[str], stream_id: FromPath[str]
    ) -> Response[ObjectView]:
        services, caller = await authenticated(request)
        body = await decode_body(request, ObjectRequest)
        view, created = await services.objects.prepare(caller, run_id, stream_id, body)
        url = f"{API_PREFIX}/runs/{run_id}/streams/{stream_id}/objects/{view.object_id}/body"
        view = msgspec.structs.replace(view, upload={"method": "PUT", "url": url})
        return Response(
            view,
            status_code=201 if created else 200,
            headers={"Location": url.removesuffix("/body")},
        )

    @get(
        "",
        operation_id="listObjects",
        summary="List the stream's open object intents",
        operation_class=documented(
            Answer(
                200,
                "Open (prepared or uploaded) intents after `after`, oldest first",
                ObjectList,
            ),
            problems=(*ON_A_STREAM, "cursor-unknown"),
        ),
    )
    async def list_open(
        self,
        request: Request,
        run_id: FromPath[str],
        stream_id: FromPath[str],
        limit: Annotated[
            int,
            Parameter(ge=1, le=MAX_OBJECTS_LIMIT, description="at most this many intents"),
        ] = DEFAULT_OBJECTS_LIMIT,
        after: Annotated[
            str | None,
            Parameter(
                description="exclusive: the intents that follow this object (`next_after`)",
                pattern=ID_PATTERN,
            ),
        ] = None,
    ) -> ObjectList:
        services, caller = await authenticated(request)
        return await services.list_objects(caller, run_id, stream_id, after, limit)

    @put(
        OBJECT + "/body",
        operation_id="uploadObjectBody",
        summary="Upload an object's body (streamed, checked against the intent)",
        request_max_body_size=None,  # the intent's size is the limit, enforced while streaming
        status_code=200,
        operation_class=documented(
            Answer(200, "Uploaded: size and digest matched the intent", ObjectView),
            problems=(
                *ON_A_STREAM,
                "object-too-large",
                "object-state-conflict",
                "digest-mismatch",
                "size-mismatch",
            ),
            request_body=RequestBody("application/octet-stream", schema=BYTES),
        ),
    )
    async def upload(
        self,
        request: Request,
        run_id: FromPath[str],
        stream_id: FromPath[str],
        object_id: FromPath[str],
    ) -> ObjectView:
        services, caller = await authenticated(request)
        announced = request.headers.get("content-length")
        length = None if announced is None else bounded_integer(announced, MAX_OBJECT_BYTES)
        if length is None and announced is not None and announced.isascii() and announced.isdigit():
            raise ObjectTooLarge(f"an object body is at most {MAX_OBJECT_BYTES} bytes")
        return await services.objects.upload(
            caller, run_id, stream_id, object_id, _chunks(request), announced=length
        )

    @post(
        OBJECT + "/commit",
        operation_id="commitObject",
        summary="Commit an uploaded object",
        operation_class=documented(
            Answer(201, "Committed: a record carries the object", CommitAnswer),
            Answer(200, "Committed before: the original record's sequence", CommitAnswer),
            problems=(
                *ON_A_STREAM,
                "object-state-conflict",
                "stream-closed",
                "backpressure",
                "quota-exhausted",
            ),
        ),
    )
    async def commit(
        self,
        request: Request,
        run_id: FromPath[str],
        stream_id: FromPath[str],
        object_id: FromPath[str],
    ) -> Response[CommitAnswer]:
        services, caller = await authenticated_reading_no_body(request)
        answer, appended = await services.objects.commit(caller, run_id, stream_id, object_id)
        return Response(answer, status_code=201 if appended else 200)

    @post(
        OBJECT + "/abort",
        operation_id="abortObject",
        summary="Abort an object",
        status_code=200,
        operation_class=documented(
            Answer(200, "Aborted (aborting again changes nothing)", ObjectView),
            problems=(*ON_A_STREAM, "object-state-conflict"),
        ),
    )
    async def abort(
        self,
        request: Request,
        run_id: FromPath[str],
        stream_id: FromPath[str],
        object_id: FromPath[str],
    ) -> ObjectView:
        services, caller = await authenticated_reading_no_body(request)
        return await services.objects.abort(caller, run_id, stream_id, object_id)

    @get(
        OBJECT,
        operation_id="getObject",
        summary="Read an object's metadata and state",
        operation_class=documented(
            Answer(200, "The object intent", ObjectView), problems=ON_A_STREAM
        ),
    )
    async def describe(
        self,
        request: Request,
        run_id: FromPath[str],
        stream_id: FromPath[str],
        object_id: FromPath[str],
    ) -> ObjectView:
        services, caller = await authenticated(request)
        return await services.objects.describe(caller, run_id, stream_id, object_id)

    @get(
        OBJECT + "/body",
        operation_id="getObjectBody",
        summary="Download a committed body",
        operation_class=documented(
            Answer(
                200,
                "The whole body, in its content type",
                media_type="*/*",
                schema=BYTES,
                headers=BODY_HEADERS,
            ),
            Answer(
                206,
                "The requested byte range",
                media_type="*/*",
                schema=BYTES,
                headers=(*BODY_HEADERS, Header("Content-Range", "bytes FIRST-LAST/SIZE")),
            ),
            problems=(*DELIVERING, "object-state-conflict", "range-not-satisfiable"),
            request_headers=(
                Header(
                    "Range", "One byte range: bytes=FIRST-[LAST] or bytes=-SUFFIX", required=False
                ),
                Header(
                    "If-Range",
                    "Serve the range only while the body's ETag is this one",
                    required=False,
                ),
            ),
        ),
    )
    async def download(
        self,
        request: Request,
        run_id: FromPath[str],
        stream_id: FromPath[str],
        object_id: FromPath[str],
    ) -> Response:
        services, caller = await authenticated(request)
        body = await services.objects.download(caller, run_id, stream_id, object_id)
        intent = body.intent
        digest = base64.b64encode(bytes.fromhex(intent.sha256)).decode()
        etag = f'"{intent.sha256}"'
        headers = {
            # As prepared: Litestar would add a charset of its own to any text/* media type.
            "Content-Type": intent.content_type,
            "Accept-Ranges": "bytes",
            "ETag": etag,
            "Repr-Digest": f"sha-256=:{digest}:",
        }
        try:
            span = _requested_span(request, intent.size, etag)
        except NotSatisfiable:
            return problems.problem(
                "range-not-satisfiable",
                f"the range names no byte of this {intent.size}-byte body",
                status=416,
                headers={"Accept-Ranges": "bytes", "Content-Range": f"bytes */{intent.size}"},
                size=intent.size,
            )
        if span is not None:
            headers["Content-Range"] = f"bytes {span.first}-{span.last}/{intent.size}"
        headers["Content-Length"] = str(intent.size if span is None else span.length)
        status = 200 if span is None else 206
        if is_head(request.scope):
            # Answered from the metadata: the store is not read.
            return Stream((), status_code=status, media_type=intent.content_type, headers=headers)
        chunks = body.read() if span is None else body.read(span.first, span.length)
        # The first read happens before the status goes out, so a body missing from the store
        # (or a store out of reach) is a problem answer rather than a cut-off 200.
        first = await anext(chunks, b"")
        return Stream(
            _prepended(first, chunks),
            status_code=status,
            media_type=intent.content_type,
            headers=headers,
        )


def _requested_span(request: Request, size: int, etag: str) -> Span | None:
    """The Range to serve; an If-Range other than this body's entity tag (a date, or another
    tag) means the client's copy may differ, so the whole body goes out (RFC 9110 §13.1.5)."""
    condition = request.headers.get("if-range")
    if condition is not None and condition.strip() != etag:
        return None
    return byte_span(request.headers.get("range"), size)


async def _prepended(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if first:
        yield first
    async for chunk in rest:
        yield chunk


async def _chunks(request: Request) -> AsyncIterator[bytes]:
    async for chunk in request.stream():
        if chunk:
            yield chunk
