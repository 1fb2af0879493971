"""No WebSockets: live reads are Server-Sent Events. A WebSocket handshake, on any path, is
refused with the 404 problem every unknown route gets, sent as the handshake's HTTP answer
(ASGI's `websocket.http.response`); a server without that extension closes it (403).

Before, the framework refused every handshake with a bare 403, without a body or the headers
every answer carries, even on a path that does not exist. (A handshake granian itself refuses,
without `Sec-WebSocket-Key` or of another version than 13, gets its bare 400: docs/errors.md.)"""

from __future__ import annotations

from typing import Any

from entrypoints.edge.browser import answer_headers
from entrypoints.edge.exchange import Exchange
from entrypoints.edge.head import RequestHead
from entrypoints.edge.problems import problem

_DENIAL = "websocket.http.response"
WEBSOCKET = "websocket"  # the route label of a handshake refused here


def refuse_websockets(app: Any, cors: Any) -> Any:
    async def adapter(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await app(scope, receive, send)
            return
        await receive()  # websocket.connect
        if _DENIAL not in (scope.get("extensions") or {}):
            await send({"type": "websocket.close", "code": 1008})
            return
        path = scope.get("path", "")
        head = RequestHead(scope.get("headers", ()))
        with Exchange("GET", path, head, route=WEBSOCKET) as exchange:  # its id, metric, log
            refused = problem(
                "not-found",
                f"no WebSocket at {path[:200]!r}: this service serves none (live reads are "
                "Server-Sent Events: GET …/subscribe, or live=sse on the Durable Streams "
                "surface)",
            )
            headers = [
                (b"content-type", b"application/problem+json"),
                (b"content-length", str(len(refused.body)).encode()),
                (b"x-request-id", exchange.request_id.encode()),
                *answer_headers(scope, cors),
            ]
            exchange.status = refused.status
            await send(
                {
                    "type": "websocket.http.response.start",
                    "status": refused.status,
                    "headers": headers,
                }
            )
            await send({"type": "websocket.http.response.body", "body": refused.body})

    return adapter
