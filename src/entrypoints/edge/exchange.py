"""One request from its head to its last byte, whichever way it is served (Litestar's
middleware or the append front): its id, its latency under its route's template, its debug
log line, and the span a trace would give it.

`request_span` is the one place a request's trace span starts and ends: it gets the method,
the path and the request's head (a W3C `traceparent` among its raw headers) and wraps the whole
exchange, answer and drain included."""

from __future__ import annotations

import contextlib
import logging
import time
from types import TracebackType
from typing import Any

from application.log_context import request_id
from entrypoints.edge.head import RequestHead
from entrypoints.edge.metrics import HOT, new_request_id

log = logging.getLogger("ductor_streams.http")

UNMATCHED = "unmatched"
_NO_SPAN = contextlib.nullcontext()  # reusable: entering it does nothing


def request_span(
    method: str, path: str, head: RequestHead
) -> contextlib.AbstractContextManager[Any]:
    """The request's trace span (none until tracing is configured)."""
    return _NO_SPAN


class Exchange:
    """`with Exchange(method, path, head) as exchange:` around serving one request. Set
    `exchange.status` when the answer starts and `exchange.route` when it is known."""

    __slots__ = (
        "_span",
        "_started",
        "_token",
        "head",
        "method",
        "path",
        "request_id",
        "route",
        "status",
    )

    def __init__(self, method: str, path: str, head: RequestHead, route: str = UNMATCHED) -> None:
        self.method = method
        self.path = path
        self.head = head
        self.route = route
        self.status = 500
        self.request_id = head.request_id or new_request_id()

    def __enter__(self) -> Exchange:
        self._token = request_id.set(self.request_id)
        self._span = request_span(self.method, self.path, self.head)
        self._span.__enter__()
        self._started = time.perf_counter()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        seconds = time.perf_counter() - self._started
        HOT.observe(self.method, self.route, str(self.status), seconds)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s %s %d %.1f ms", self.method, self.path, self.status, seconds * 1e3)
        try:
            self._span.__exit__(kind, error, traceback)
        finally:
            request_id.reset(self._token)
