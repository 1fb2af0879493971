"""The hottest routes, served in front of the router: a POST of records to one stream, on the
native surface (`POST …/runs/{run_id}/streams/{stream_id}/records`) and on the Durable Streams
one (`POST /api/durable-streams/v1/stream/{streamID}` and `…/{runID}/{streamID}`).

A single-record append is the request every agent streaming tokens makes. Through Litestar it
passed the exception middleware twice, the router, the request-id middleware, the guard (which
copies the connection), the handler's parameter machinery and `Request.body` (which copies the
scope): about 30% of the server's CPU per append when profiled (bench (2), py-spy). Here the same
work is done once, by the same functions:

- only a `POST` whose path is exactly one of the routes' templates with non-empty IDs is taken;
  anything else (HEAD, a trailing slash, `//`, another method, a WebSocket) goes to Litestar
  unchanged, so every edge case keeps the router's answer;
- the request checks of `request_checks.py` (encoded `%2F`, content and transfer codings), the
  request id, the latency metric (under the route's own template) and the body size limit of
  the application (`413`, closing the connection, as `request_middleware` does);
- the handler is the route handler's body: `StreamsController.append_records`' through the same
  use case, and `protocol.append` itself for the Durable Streams routes;
- every failure is answered by the application's own exception handlers (the same problem
  answers, headers and logs), chosen the way Litestar chooses them;
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
from typing import Any, cast

from litestar import Litestar, Request
from litestar.exceptions import HTTPException, InternalServerException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.types import HTTPScope

from application.access import Caller
from application.log_context import request_id
from domain.digits import bounded_integer
from entrypoints.durable_streams import protocol
from entrypoints.durable_streams.browser import allowed_origin, answer_headers
from entrypoints.http import observability
from entrypoints.http.answers import JsonAnswer
from entrypoints.http.body import decode_json
from entrypoints.http.observability import HOT, MAX_CONTENT_LENGTH
from entrypoints.http.request_checks import check_scope
from entrypoints.http.schemas import AppendBody

log = logging.getLogger("ductor_streams.http")

# What Litestar's router records as `path_template` for each route (the metric's `route` label).
ROUTE = "/api/workflow-streams/runs/{run_id}/streams/{stream_id}/records"
_APPEND = re.compile(r"/api/workflow-streams/runs/([^/]+)/streams/([^/]+)/records")
_DS = protocol.PREFIX + protocol.STREAM_PATH
DS_ROUTE_ONE = _DS + "/{stream_id}"
DS_ROUTE_IN_RUN = _DS + "/{run_id}/{stream_id}"
_DS_APPEND = re.compile(re.escape(_DS) + r"/([^/]+)(?:/([^/]+))?")
_REPLAYED = ((b"idempotent-replayed", b"true"),)
_RID = b"x-request-id"
_CUT_SHORT = "client disconnected prematurely"  # Litestar's words, which problems.py maps


def hot_routes(app: Litestar, router: Any, max_body: int, origins: Iterable[str]) -> Any:
    """An ASGI app that answers the append routes itself and hands the rest to `router`. It is
    the outermost layer: what `browser_headers` (inside it) adds to every answer, it adds to
    its own."""
    handlers = app.exception_handlers
    cors = allowed_origin(origins)

    async def front(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path = scope["path"]
            match = _APPEND.fullmatch(path)
            if match is not None:
                await _serve(scope, receive, send, ROUTE, None, _native, match.groups())
                return
            match = _DS_APPEND.fullmatch(path)
            if match is not None:
                run_id, stream_id = match.groups()
                route = DS_ROUTE_ONE if stream_id is None else DS_ROUTE_IN_RUN
                params = (
                    {"stream_id": run_id}
                    if stream_id is None
                    else {"run_id": run_id, "stream_id": stream_id}
                )
                await _serve(scope, receive, send, route, _protocol_head, _protocol, params)
                return
        await router(scope, receive, send)

    async def _native(
        head: None,
        body: bytes,
        where: tuple[str, str],
        caller: Caller,
        idempotency_key: str | None,
        extra: list[tuple[bytes, bytes]],
    ) -> tuple[Any, int]:
        """`StreamsController.append_records` (which decodes the body before the use case
        checks the caller's scope: so does this)."""
        records = decode_json(body, AppendBody).records
        answer, replayed = await app.state.services.append_records(
            caller, *where, records, idempotency_key
        )
        if replayed:
            return JsonAnswer(answer, 200, (*_REPLAYED, *extra)), 200
        return JsonAnswer(answer, 201, extra), 201

    async def _protocol_head(scope: dict, params: dict[str, str], caller: Caller) -> Any:
        """`protocol.append`'s checks of the head, before the body is read, in the route's
        order."""
        request = _Request(app, scope, params)
        # _Request stands in for the litestar.Request that append_head is typed against: it
        # carries only what append_head reads (scope, path parameters, headers).
        return request, await protocol.append_head(request, caller)  # type: ignore[arg-type]

    async def _protocol(
        head: Any,
        body: bytes,
        where: dict[str, str],
        caller: Caller,
        idempotency_key: str | None,
        extra: list[tuple[bytes, bytes]],
    ) -> tuple[Any, int]:
        """The rest of `DurableStreamsController.append_one` and `append_in_run`."""
        request, decided = head
        answer = await protocol.append_body(request, decided, body)
        answer.extra = extra
        return answer, answer.status

    async def _serve(
        scope: dict,
        receive: Any,
        send: Any,
        route: str,
        before: Any,
        handle: Any,
        where: Any,
    ) -> None:
        """One append: `before(scope, where, caller)` (if any) checks its head once the caller
        is known, then the body is read and `handle(head, body, where, caller, key, headers)`
        answers."""
        started = time.perf_counter()
        scope["path_template"] = route  # as the router records it (the request's span reads it)
        rid = authorization = idempotency_key = None
        declared: int | None = None
        lengths = 0
        closing = False
        for name, value in scope["headers"]:  # the first of each, as Headers.get
            if name == b"authorization":
                if authorization is None:
                    authorization = value.decode("latin-1")
            elif name == b"idempotency-key":
                if idempotency_key is None:
                    idempotency_key = value.decode("latin-1")
            elif name == b"content-length":
                declared = bounded_integer(value, MAX_CONTENT_LENGTH)
                lengths += 1
            elif name == b"transfer-encoding":
                lengths += 2  # chunked framing: the Content-Length (if any) does not count
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
                caller = await app.state.services.authenticate(authorization)
                head = None if before is None else await before(scope, where, caller)
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
                        if not message.get("more_body", False) or (
                            received == declared and lengths == 1
                        ):
                            # All the one Content-Length said (and no Transfer-Encoding): the
                            # server's closing message (an empty one, from granian) is not
                            # waited for, a receive saved.
                            body_done = True
                            break
                    elif message["type"] == "http.disconnect":
                        body_done = True
                        raise InternalServerException(_CUT_SHORT)
                body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                extra = answer_headers(scope, cors)
                extra.append((_RID, rid.encode()))
                response, status = await handle(head, body, where, caller, idempotency_key, extra)
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
            HOT.observe("POST", route, str(status), seconds)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%s %s %d %.1f ms", "POST", scope["path"], status, seconds * 1e3)
            request_id.reset(token)

    def _problem(scope: dict, receive: Any, error: Exception) -> tuple[Any, int]:
        handler = _handler_of(handlers, error)
        request: Request = Request(
            cast("HTTPScope", {**scope, "app": app, "litestar_app": app, "path_params": {}}),
            receive,
        )
        response = handler(request, error)
        return response.to_asgi_response(app=None, request=request), response.status_code

    return front


def _handler_of(handlers: Any, error: Exception) -> Any:
    """The application's handler for `error`, chosen as Litestar chooses it: an HTTPException's
    status code first, then the first class of the error's MRO with a handler (`Exception`
    has one, so there always is one)."""
    if isinstance(error, HTTPException) and (by_status := handlers.get(error.status_code)):
        return by_status
    for kind in type(error).__mro__:
        if kind in handlers:
            return handlers[kind]
    raise error  # never: Exception itself is handled


class _Headers:
    """The two lookups `protocol.append` makes of a request's headers, as Litestar's Headers
    answers them (names are lower case in ASGI, values latin-1; `get` the first of a repeated
    header), from one pass over the few there are rather than a case-insensitive multidict."""

    __slots__ = ("_by_name",)

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        by_name: dict[bytes, list[bytes]] = {}
        for key, value in raw:
            values = by_name.get(key)
            if values is None:
                by_name[key] = [value]
            else:
                values.append(value)
        self._by_name = by_name

    def get(self, name: str, default: str | None = None) -> str | None:
        values = self._by_name.get(name.lower().encode("latin-1"))
        return default if values is None else values[0].decode("latin-1")

    def getall(self, name: str, default: list[str] | None = None) -> list[str]:
        values = self._by_name.get(name.lower().encode("latin-1"))
        if values is not None:
            return [value.decode("latin-1") for value in values]
        if default is None:
            raise KeyError(name)
        return default


class _Request:
    """What `protocol.append` reads of a Litestar Request: the app, the scope, the path
    parameters and the headers (the body is handed to `protocol.append_body`)."""

    __slots__ = ("_headers", "app", "path_params", "scope")

    def __init__(self, app: Litestar, scope: dict, params: dict[str, str]) -> None:
        self.app = app
        self.scope = scope
        self.path_params = params
        self._headers: _Headers | None = None

    @property
    def headers(self) -> _Headers:
        if self._headers is None:
            self._headers = _Headers(self.scope["headers"])
        return self._headers


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
