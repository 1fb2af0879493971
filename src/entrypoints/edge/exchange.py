"""One request from its head to its last byte, whichever way it is served (Litestar's
middleware or the append front): its id, its latency under its route's template and its debug
log line. Its trace span, while tracing is on, is started outside it, around the whole
application, by `entrypoints/http/traced.py` (so that off, nothing of tracing is on this path)."""

from __future__ import annotations

import logging
import time
from types import TracebackType

from application.log_context import request_id
from entrypoints.edge.head import RequestHead
from entrypoints.edge.metrics import HOT, new_request_id

log = logging.getLogger("ductor_streams.http")

UNMATCHED = "unmatched"


class Exchange:
    """`with Exchange(method, path, head) as exchange:` around serving one request. Set
    `exchange.status` when the answer starts and `exchange.route` when it is known."""

    __slots__ = (
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
        request_id.reset(self._token)
