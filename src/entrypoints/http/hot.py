"""The hottest route, served in front of the router: a POST of records to one stream.

A single-record append is the request every agent streaming tokens makes. Through Litestar it
passed the exception middleware twice, the router, the request-id middleware, the guard (which
copies the connection), the handler's parameter machinery and `Request.body` (which copies the
scope): about 30% of the server's CPU per append when profiled (bench (2), py-spy). Here the same
work is done once, by the same functions:

- only a request whose path is exactly the route's template with two non-empty IDs and whose
  method is `POST` is taken; anything else (HEAD, a trailing slash, `//`, another method, a
  WebSocket) goes to Litestar unchanged, so every edge case keeps the router's answer;
- the request checks of `request_checks.py` (encoded `%2F`, content and transfer codings), the
  request id, the latency metric (under the route's own template) and the body size limit of
  the application (`413`, closing the connection, as `request_middleware` does);
- the handler is `StreamsController.append_records`' body, through the same use case;
- every failure is answered by the application's own exception handlers (the same problem
  answers, headers and logs), chosen the way Litestar chooses them.

- the security and CORS headers `browser_headers` adds to every other answer.

Measured with bench (2) against (3), the no-op through Litestar, in one run: 27.9% -> 51.5%
with the router skipped, then 5% of the server's CPU less with the security headers added
here rather than by wrapping `send` (docs/architecture.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Iterable
from typing import Any

from litestar import Litestar, Request
from litestar.exceptions import InternalServerException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.middleware._internal.exceptions.middleware import get_exception_handler

from application.log_context import request_id
from entrypoints.durable_streams.browser import allowed_origin, answer_headers
from entrypoints.http import observability
from entrypoints.http.answers import JsonAnswer
from entrypoints.http.body import decode_json
from entrypoints.http.observability import HOT
from entrypoints.http.request_checks import check_scope
from entrypoints.http.schemas import AppendBody

log = logging.getLogger("ductor_streams.http")

# What Litestar's router records as `path_template` for the route (the metric's `route` label).
ROUTE = "/api/workflow-streams/runs/{run_id}/streams/{stream_id}/records"
_APPEND = re.compile(r"/api/workflow-streams/runs/([^/]+)/streams/([^/]+)/records")
_REPLAYED = ((b"idempotent-replayed", b"true"),)
_RID = b"x-request-id"
_CUT_SHORT = "client disconnected prematurely"  # Litestar's words, which problems.py maps


def hot_routes(app: Litestar, router: Any, max_body: int, origins: Iterable[str]) -> Any:
    """An ASGI app that answers the append route itself and hands the rest to `router`. It is
    the outermost layer: what `browser_headers` (inside it) adds to every answer, it adds to
    its own."""
    handlers = app.exception_handlers
    cors = allowed_origin(origins)

    async def front(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match = _APPEND.fullmatch(scope["path"])
            if match is not None:
                await _append(scope, receive, send, match[1], match[2])
                return
        await router(scope, receive, send)

    async def _append(scope: dict, receive: Any, send: Any, run_id: str, stream_id: str) -> None:
        started = time.perf_counter()
        rid = authorization = idempotency_key = None
        declared: int | None = None
        closing = False
        for name, value in scope["headers"]:  # the first of each, as Headers.get
            if name == b"authorization":
                if authorization is None:
                    authorization = value.decode("latin-1")
            elif name == b"idempotency-key":
                if idempotency_key is None:
                    idempotency_key = value.decode("latin-1")
            elif name == b"content-length":
                declared = int(value) if value.isdigit() else None
            elif name == b"x-request-id":
                rid = value.decode("latin-1")[:128]
            elif name == b"connection" and value.lower() == b"close":
                closing = True
        rid = rid or observability.new_request_id()
        token = request_id.set(rid)
        status = 500
        received = 0
        body_done = False
        try:
            try:
                check_scope(scope)
                # In the route's order: the token before the body (a refused caller's body is
                # never read, and is answered 401 whatever it holds or however large it is).
                services = app.state.services
                caller = await services.authenticate(authorization)
                if declared is not None and declared > max_body:
                    raise RequestEntityTooLarge
                chunks: list[bytes] = []
                while True:
                    message = await receive()
                    if message["type"] == "http.request":
                        piece = message.get("body", b"")
                        if piece:
                            received += len(piece)
                            if received > max_body:
                                # Read to its end already (uvicorn hands over what it has):
                                # then the connection is kept, as request_middleware keeps it.
                                body_done = not message.get("more_body", False)
                                raise RequestEntityTooLarge
                            chunks.append(piece)
                        if not message.get("more_body", False):
                            body_done = True
                            break
                    elif message["type"] == "http.disconnect":
                        body_done = True
                        raise InternalServerException(_CUT_SHORT)
                body = decode_json(chunks[0] if len(chunks) == 1 else b"".join(chunks), AppendBody)
                answer, replayed = await services.append_records(
                    caller, run_id, stream_id, body.records, idempotency_key
                )
                extra = answer_headers(scope, cors)
                extra.append((_RID, rid.encode()))
                if replayed:
                    response: Any = JsonAnswer(answer, 200, (*_REPLAYED, *extra))
                    status = 200
                else:
                    HOT.appends += 1
                    HOT.records += answer.last_sequence - answer.first_sequence + 1
                    response = JsonAnswer(answer, 201, extra)
                    status = 201
            except Exception as error:
                response, status = _problem(scope, receive, error)
                # Raw, as on an answer that succeeded: the id as request_middleware encodes it.
                raw = response.headers.headers
                raw.extend(answer_headers(scope, cors))
                raw.append((_RID, rid.encode()))
                if status == 413 and not body_done:
                    raw.append((b"connection", b"close"))
            await response(scope, receive, send)
            if body_done or closing:
                return
            if status == 413:  # read on only briefly, for a body a little over the limit
                left = None if declared is None else declared - received
                if left is None or left <= observability.LINGER_LIMIT:
                    await _drain(receive, observability.LINGER_LIMIT, observability.LINGER_SECONDS)
            else:
                await _drain(receive, observability.DRAIN_LIMIT, None)
        finally:
            seconds = time.perf_counter() - started
            HOT.observe("POST", ROUTE, str(status), seconds)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%s %s %d %.1f ms", "POST", scope["path"], status, seconds * 1e3)
            request_id.reset(token)

    def _problem(scope: dict, receive: Any, error: Exception) -> tuple[Any, int]:
        handler = get_exception_handler(handlers, error)
        if handler is None:  # never: Exception itself is handled
            raise error
        request: Request = Request(
            {**scope, "app": app, "litestar_app": app, "path_params": {}}, receive
        )
        response = handler(request, error)
        return response.to_asgi_response(app=None, request=request), response.status_code

    return front


async def _drain(receive: Any, limit: int, seconds: float | None) -> None:
    """What is left of a body the route did not read (it failed before reading it all),
    bounded in bytes, idle time and in all, as `request_middleware` reads it."""
    drained = 0
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            while drained < limit:
                async with asyncio.timeout(observability.DRAIN_IDLE_SECONDS):
                    message = await receive()
                if message["type"] != "http.request":
                    return
                drained += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return
