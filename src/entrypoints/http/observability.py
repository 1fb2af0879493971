"""Operating the service: Prometheus metrics and request ids.

Counters and the latency histogram are kept per process by a thin ASGI middleware; figures that
live in PostgreSQL (outbox backlogs and lag, object states) are read through the application's
query (application/figures.py) when /metrics is scraped, at most once per 5 s. Appends and
records are counted by the application where they commit (application/throughput.py).
Names follow Prometheus' conventions: counters end in `_total`, durations are in seconds."""

from __future__ import annotations

import logging
from typing import Any

from litestar import Request, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    Gauge,
    generate_latest,
)

from application import waiting
from entrypoints.container import Container, provided
from entrypoints.edge.body import Body
from entrypoints.edge.exchange import UNMATCHED, Exchange
from entrypoints.edge.head import RequestHead
from entrypoints.edge.head_method import method_of
from entrypoints.edge.metrics import HOT, REGISTRY

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


async def metrics(request: Request) -> Response[bytes]:
    container: Container = request.app.state.container
    SUBSCRIBERS.set((await provided(container.live_slots)).count())
    HOT.throughput = await provided(container.throughput)
    HOT.live_outages = (await provided(container.tails)).outages
    bus = await provided(container.wake_bus)
    if bus is not None:
        HOT.wake_reconnects = bus.reconnects
        HOT.gaps_repaired = bus.gaps_repaired
        HOT.wake_replacements = bus.replacements
        HOT.wake_not_live = bus.not_live_episodes
        HOT.wake_live = int(bus.live)
    peers = await provided(container.peers)
    if peers is not None:
        HOT.appends_forwarded = peers.forwarded
        HOT.appends_received = peers.received
    pool = await provided(container.pool)
    if pool is not None and pool.shares is not None:
        HOT.tenant_share_waits = pool.shares.waited
    HOT.tenant_turn_waits = waiting.turn_waits[0]
    HOT.tenant_turn_queue_full = waiting.turn_queue_full[0]
    HOT.tenant_answers_refused = waiting.answers_refused[0]
    deliverer = await provided(container.deliver_wakes)
    HOT.webhook_attempts = deliverer.attempts
    HOT.webhook_failures = deliverer.failures
    figures = await (await provided(container.figures))()
    if figures is None:  # the database cannot be read now: answered without its figures
        for gauge in (OUTBOX_PENDING, OUTBOX_LAG, OBJECTS):
            gauge.clear()
    else:
        for backlog in figures.backlogs:
            OUTBOX_PENDING.labels(backlog.outbox).set(backlog.pending)
            OUTBOX_LAG.labels(backlog.outbox).set(backlog.lag_seconds)
        for object_state, count in figures.objects.items():
            OBJECTS.labels(object_state).set(count)
    return Response(generate_latest(REGISTRY), media_type=_MEDIA_TYPE)


# Litestar adds "; charset=utf-8" to every text/ media type itself.
_MEDIA_TYPE = CONTENT_TYPE_LATEST.replace("; charset=utf-8", "")
