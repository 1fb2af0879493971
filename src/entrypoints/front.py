"""The append front: the hottest routes answered before the router, by the same functions the
router's handlers call.

A single-record append is the request every agent streaming tokens makes. Through Litestar it
passed the exception middleware twice, the router, the guard (which copies the connection), the
handler's parameter machinery and `Request.body` (which copies the scope): about 30% of the
server's CPU per append when profiled (bench (2), py-spy). So a `POST` whose path is exactly
one of these templates, with non-empty IDs, is dispatched here:

- `POST /api/workflow-streams/runs/{run_id}/streams/{stream_id}/records` to `http/appends.py`;
- `POST /api/durable-streams/v1/stream/{streamID}` and `…/{runID}/{streamID}` to
  `durable_streams/protocol.py`'s `append_head` (before the body is read) and `append_body`.

Anything else (HEAD, a trailing slash, `//`, another method, a WebSocket) goes to Litestar
unchanged, so every edge case keeps the router's answer. Everything around the handler is the
request pipeline of `entrypoints/edge/` that Litestar's middleware runs too: the head read once
(`RequestHead`), the request checks, the request id, latency and trace span (`Exchange`), the
body under its limit with 413/drain/linger (`Body`), the problem answer of any error
(`problem_for`), the security and CORS headers (`answer_headers`).

Measured with bench (2) against (3), the no-op through Litestar, in one run: 27.9% -> 51.5%
with the router skipped, then 5% of the server's CPU less with the security headers added
here rather than by wrapping `send` (docs/architecture.md)."""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from application.waiting import client_watched
from entrypoints.container import Services
from entrypoints.durable_streams import protocol
from entrypoints.durable_streams.answers import Answer
from entrypoints.edge.body import Body
from entrypoints.edge.browser import allowed_origin, answer_headers
from entrypoints.edge.checks import check_scope
from entrypoints.edge.exchange import Exchange
from entrypoints.edge.head import RequestHead, RequestHeaders
from entrypoints.edge.leaving import ClientLeft, answer_to_nobody, unless_client_leaves
from entrypoints.edge.paths import DURABLE_STREAMS_PREFIX, NATIVE_PREFIX, STREAM_PATH
from entrypoints.edge.problems import PROBLEM_JSON, problem_for
from entrypoints.http import appends

# What Litestar's router records as `path_template` for each route (the metric's `route` label).
NATIVE_ROUTE = appends.ROUTE
_NATIVE = re.compile(re.escape(NATIVE_PREFIX) + r"/runs/([^/]+)/streams/([^/]+)/records")
_DS = DURABLE_STREAMS_PREFIX + STREAM_PATH
DS_ROUTE_ONE = _DS + "/{stream_id}"
DS_ROUTE_IN_RUN = _DS + "/{run_id}/{stream_id}"
_DS_APPEND = re.compile(re.escape(_DS) + r"/([^/]+)(?:/([^/]+))?")
_RID = b"x-request-id"
# The protocol's reserved first segment (its subscription APIs, `…/__ds/…`): never a stream.
RESERVED = "__ds"

ASGI = Callable[[Any, Any, Any], Awaitable[None]]


def append_front(
    services: Callable[[], Services], router: ASGI, max_body: int, origins: Iterable[str]
) -> ASGI:
    """An ASGI app that answers the append routes itself and hands the rest to `router`.
    `services` gives the running application's services (they exist once it has started)."""
    cors = allowed_origin(origins)

    async def front(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path = scope["path"]
            match = _NATIVE.fullmatch(path)
            if match is not None:
                await serve(scope, receive, send, NATIVE_ROUTE, match.groups())
                return
            match = _DS_APPEND.fullmatch(path)
            if match is not None and match.group(1) != RESERVED:
                first, second = match.groups()
                if second is None:
                    at = protocol.Where(protocol.DEFAULT_RUN, first, False)
                    await serve(scope, receive, send, DS_ROUTE_ONE, at)
                else:
                    at = protocol.Where(first, second, True)
                    await serve(scope, receive, send, DS_ROUTE_IN_RUN, at)
                return
        await router(scope, receive, send)

    async def serve(scope: dict, receive: Any, send: Any, route: str, where: Any) -> None:
        scope["path_template"] = route  # as the router records it (the request's span reads it)
        head = RequestHead(scope["headers"])
        body = Body(receive, head)
        with Exchange("POST", scope["path"], head, route) as exchange:
            rid = exchange.request_id.encode()
            try:
                check_scope(scope)
                # In the route's order: the token before the body (a refused caller's body is
                # never read, and is answered 401 whatever it holds or however large it is).
                running = services()
                caller = await running.authenticate(head.authorization)
                extra = answer_headers(scope, cors)
                extra.append((_RID, rid))
                answer: Any
                # An append waiting for credit (`block`) ends if its client leaves (read whole,
                # its body is no longer what `receive` waits for by then).
                with client_watched(functools.partial(unless_client_leaves, receive)):
                    if route == NATIVE_ROUTE:
                        run_id, stream_id = where
                        content = await body.read(max_body)
                        answer = await appends.append(
                            running, caller, run_id, stream_id, content, head.idempotency_key, extra
                        )
                        exchange.status = answer.status
                    else:
                        headers = RequestHeaders(head.raw)
                        decided = protocol.append_head(running, caller, where, headers)
                        answer = await protocol.append_body(decided, await body.read(max_body))
                        answer.extra = extra
                        exchange.status = answer.status
            except ClientLeft:
                exchange.status = 499
                answer = answer_to_nobody
            except Exception as error:
                problem = problem_for(error, "POST", scope["path"])
                exchange.status = problem.status
                answer = Answer(problem.status, {"Content-Type": PROBLEM_JSON, **problem.headers})
                answer.body = problem.body
                answer.extra = answer_headers(scope, cors)
                answer.extra.append((_RID, rid))
                if body.closes(problem.status):
                    answer.extra.append((b"connection", b"close"))
            await answer(scope, receive, send)
            await body.finish(exchange.status)

    return front
