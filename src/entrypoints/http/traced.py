"""The span of every HTTP request, outermost: both surfaces, the append front included.

Installed only while tracing is on (entrypoints/tracing.py), so that off it costs nothing. A
W3C `traceparent` (and `tracestate`) makes the request's span a child of the caller's; the span
is named by the method and the route's template (`path_template`, which the router and the
append front record), and carries the answer's status."""

from __future__ import annotations

from typing import Any

from application import tracing
from entrypoints.edge.head_method import method_of


def traced_requests(app: Any) -> Any:
    async def traced(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        traceparent = tracestate = None
        for name, value in scope["headers"]:
            if name == b"traceparent":
                traceparent = value.decode("latin-1")
            elif name == b"tracestate":
                tracestate = value.decode("latin-1")
        status = 500

        async def sending(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        method = method_of(scope)
        with tracing.request_span(method, traceparent, tracestate) as span:
            try:
                await app(scope, receive, sending)
            finally:
                if span is not None:
                    route = scope.get("path_template")
                    span.update_name(f"{method} {route}" if route else method)
                    span.set_attributes(
                        {
                            "http.request.method": method,
                            "http.route": route or "",
                            "url.path": scope["path"],
                            "http.response.status_code": status,
                        }
                    )
                    if status >= 500:
                        from opentelemetry.trace import Status, StatusCode

                        span.set_status(Status(StatusCode.ERROR))

    return traced
