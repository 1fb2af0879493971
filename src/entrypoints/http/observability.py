"""Operating the service: Prometheus metrics and request ids.

Counters and the latency histogram are kept per process by a thin ASGI middleware; figures that
live in PostgreSQL (outbox backlogs and lag, object states) are read when /metrics is scraped,
at most once per `DB_FIGURES_SECONDS`, so a busy scraper costs the database next to nothing.
Names follow Prometheus' conventions: counters end in `_total`, durations are in seconds."""

from __future__ import annotations

import logging
import time
from typing import Any

import asyncpg
from litestar import Request, Response, get
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    Gauge,
    generate_latest,
)

from adapters.postgres.bounded import BoundedPool
from entrypoints.container import resolved
from entrypoints.edge.body import Body
from entrypoints.edge.exchange import UNMATCHED, Exchange
from entrypoints.edge.head import RequestHead
from entrypoints.edge.head_method import method_of
from entrypoints.edge.metrics import HOT, REGISTRY

DB_FIGURES_SECONDS = 5.0

log = logging.getLogger("ductor_streams.http")

SUBSCRIBERS = Gauge(
    "ductor_streams_active_subscriptions",
    "Open live connections: subscriptions and waiting reads, of both surfaces",
    registry=REGISTRY,
)
OUTBOX_PENDING = Gauge(
    "ductor_streams_outbox_pending", "Undone outbox rows", ["outbox"], registry=REGISTRY
)
OUTBOX_LAG = Gauge(
    "ductor_streams_outbox_lag_seconds",
    "Age of the oldest undone outbox row",
    ["outbox"],
    registry=REGISTRY,
)
OBJECTS = Gauge("ductor_streams_objects", "Object intents by state", ["state"], registry=REGISTRY)

_DB_FIGURES = """
SELECT 'input_delivery', count(*), coalesce(extract(epoch FROM now() - min(r.appended_at)), 0)
FROM input_deliveries d JOIN stream_records r USING (tenant, run_id, stream_id, sequence)
WHERE d.delivered_at IS NULL
UNION ALL
SELECT 'deletion', count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)
FROM deletion_outbox WHERE done_at IS NULL
"""


def request_middleware(app: Any) -> Any:
    """Litestar's side of the request pipeline (entrypoints/edge/): the request's id, its
    latency under its route's template, its trace span, the rest of a body the handler did not
    read, and a 413 before the body's end closing the connection. With
    DUCTOR_STREAMS_LOG_LEVEL=DEBUG, each request is logged."""

    async def middleware(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        head = RequestHead(scope.get("headers", ()))
        body = Body(receive, head)
        with Exchange(method_of(scope), scope["path"], head) as exchange:
            rid = exchange.request_id.encode()

            async def send_with_id(message: dict) -> None:
                if message["type"] == "http.response.start":
                    exchange.status = status = message["status"]
                    headers = [*message.get("headers", ()), (b"x-request-id", rid)]
                    if body.closes(status):
                        headers.append((b"connection", b"close"))
                    message["headers"] = headers
                await send(message)

            try:
                await app(scope, body.receive if head.has_body else receive, send_with_id)
                await body.finish(exchange.status)
            finally:
                exchange.route = scope.get("path_template") or UNMATCHED

    return middleware


_last_db_read = 0.0


@get("/metrics", operation_id="metrics", tags=["operations"], include_in_schema=True)
async def metrics(request: Request) -> Response[bytes]:
    global _last_db_read
    container = request.app.state.container
    SUBSCRIBERS.set((await resolved(container.live_slots())).count())
    bus = await resolved(container.wake_bus())
    if bus is not None:
        HOT.wake_reconnects = bus.reconnects
        HOT.gaps_repaired = bus.gaps_repaired
        HOT.wake_replacements = bus.replacements
        HOT.wake_not_live = bus.not_live_episodes
        HOT.wake_live = int(bus.live)
    pool = await resolved(container.pool())
    if (
        isinstance(pool, asyncpg.Pool | BoundedPool)
        and time.monotonic() - _last_db_read > DB_FIGURES_SECONDS
    ):
        _last_db_read = time.monotonic()
        for outbox, pending, lag in await pool.fetch(_DB_FIGURES):
            OUTBOX_PENDING.labels(outbox).set(pending)
            OUTBOX_LAG.labels(outbox).set(float(lag))
        for object_state, count in await pool.fetch(
            "SELECT state, count(*) FROM object_intents GROUP BY state"
        ):
            OBJECTS.labels(object_state).set(count)
    return Response(generate_latest(REGISTRY), media_type=_MEDIA_TYPE)


# Litestar adds "; charset=utf-8" to every text/ media type itself.
_MEDIA_TYPE = CONTENT_TYPE_LATEST.replace("; charset=utf-8", "")
