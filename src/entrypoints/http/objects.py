"""The object routes: prepare, upload (streamed), commit, abort, metadata and download."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

import msgspec
from litestar import Controller, Request, Response, get, post, put
from litestar.response import Stream

from application.objects import CommitAnswer, ObjectView
from domain.definition import MAX_OBJECT_BYTES
from domain.errors import ObjectTooLarge
from domain.objects import ObjectRequest
from entrypoints.http.body import decode_body
from entrypoints.http.streams import API_PREFIX, authenticated

OBJECT = "/{object_id:str}"


class ObjectsController(Controller):
    path = API_PREFIX + "/runs/{run_id:str}/streams/{stream_id:str}/objects"
    tags = ["objects"]

    @post("", operation_id="prepareObject", summary="Prepare an object intent")
    async def prepare(self, request: Request, run_id: str, stream_id: str) -> Response[ObjectView]:
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

    @put(
        OBJECT + "/body",
        operation_id="uploadObjectBody",
        summary="Upload an object's body (streamed, checked against the intent)",
        request_max_body_size=None,  # the intent's size is the limit, enforced while streaming
        status_code=200,
    )
    async def upload(
        self, request: Request, run_id: str, stream_id: str, object_id: str
    ) -> ObjectView:
        services, caller = await authenticated(request)
        announced = request.headers.get("content-length")
        if announced is not None and announced.isdigit() and int(announced) > MAX_OBJECT_BYTES:
            raise ObjectTooLarge(f"an object body is at most {MAX_OBJECT_BYTES} bytes")
        return await services.objects.upload(caller, run_id, stream_id, object_id, _chunks(request))

    @post(OBJECT + "/commit", operation_id="commitObject", summary="Commit an uploaded object")
    async def commit(
        self, request: Request, run_id: str, stream_id: str, object_id: str
    ) -> Response[CommitAnswer]:
        services, caller = await authenticated(request)
        answer, appended = await services.objects.commit(caller, run_id, stream_id, object_id)
        return Response(answer, status_code=201 if appended else 200)

    @post(OBJECT + "/abort", operation_id="abortObject", summary="Abort an object", status_code=200)
    async def abort(
        self, request: Request, run_id: str, stream_id: str, object_id: str
    ) -> ObjectView:
        services, caller = await authenticated(request)
        return await services.objects.abort(caller, run_id, stream_id, object_id)

    @get(OBJECT, operation_id="getObject", summary="Read an object's metadata and state")
    async def describe(
        self, request: Request, run_id: str, stream_id: str, object_id: str
    ) -> ObjectView:
        services, caller = await authenticated(request)
        return await services.objects.describe(caller, run_id, stream_id, object_id)

    @get(OBJECT + "/body", operation_id="getObjectBody", summary="Download a committed body")
    async def download(
        self, request: Request, run_id: str, stream_id: str, object_id: str
    ) -> Stream:
        services, caller = await authenticated(request)
        intent, body = await services.objects.download(caller, run_id, stream_id, object_id)
        digest = base64.b64encode(bytes.fromhex(intent.sha256)).decode()
        return Stream(
            body,
            media_type=intent.content_type,
            headers={
                "Content-Length": str(intent.size),
                "Repr-Digest": f"sha-256=:{digest}:",
            },
        )


async def _chunks(request: Request) -> AsyncIterator[bytes]:
    async for chunk in request.stream():
        if chunk:
            yield chunk
