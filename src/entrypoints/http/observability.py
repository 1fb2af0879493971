"""Operating the service: Prometheus metrics and request ids.

Counters and the latency histogram are kept per process by a thin ASGI middleware; figures that
live in PostgreSQL (outbox backlogs and lag, object states) are read through the application's
query (application/figures.py) when /metrics is scraped, at most once per 5 s. Appends and
records are counted by the application where they commit (application/throughput.py).
Names follow Prometheus' conventions: counters end in `_total`, durations are in seconds."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import logging
import secrets
import time
from collections.abc import Iterator
from typing import Any

from litestar import Request, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Gauge,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from application.live import TailOutages
from application.log_context import request_id
from application.throughput import Throughput
from domain.digits import bounded_integer
from entrypoints.container import Container, provided
from entrypoints.http.head import method_of

log = logging.getLogger("ductor_streams.http")

REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0)


class HotPath:
    """Counters touched on every request, kept as plain numbers and turned into metric
    families only when scraped. prometheus_client's own metrics take a threading lock per
    update, and under granian's threads that (with uuid4's getrandom) cost tens of µs a
    request when measured; this loop-confined state needs no lock."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, str], list[float]] = {}
        # The application's counts of what committed (application/throughput.py), read when
        # scraped: the container's, once /metrics has run.
        self.throughput = Throughput()
        self.live_outages = TailOutages()  # the live tails' (application/live.py), likewise
        self.problems: dict[str, int] = {}
        # The wake bus's own running counts, copied here when /metrics is scraped.
        self.wake_reconnects = 0
        self.gaps_repaired = 0
        self.wake_replacements = 0
        self.wake_not_live = 0
        self.wake_live = 1

    def observe(self, method: str, route: str, status: str, seconds: float) -> None:
        cell = self.requests.get((method, route, status))
        if cell is None:
            cell = self.requests[method, route, status] = [0.0] * (len(BUCKETS) + 2)
        cell[bisect.bisect_left(BUCKETS, seconds)] += 1  # the last bucket is +Inf
        cell[-1] += seconds

    def problem(self, code: str) -> None:
        self.problems[code] = self.problems.get(code, 0) + 1

    def collect(self) -> Iterator[Any]:
        latency = HistogramMetricFamily(
            "ductor_streams_request_duration_seconds",
            "HTTP request latency by route and status",
            labels=["method", "route", "status"],
        )
        for labels, cell in self.requests.items():
            cumulative, buckets = 0.0, []
            for bound, count in zip((*BUCKETS, float("inf")), cell[:-1], strict=True):
                cumulative += count
                buckets.append((str(bound) if bound != float("inf") else "+Inf", cumulative))
            latency.add_metric(list(labels), buckets, cell[-1])
        yield latency
        appends = CounterMetricFamily(
            "ductor_streams_appends",
            "Commands that appended records, by surface and entry (append, create, object)",
            labels=["surface", "entry"],
        )
        records = CounterMetricFamily(
            "ductor_streams_records",
            "Records appended, by surface and entry (append, create, object)",
            labels=["surface", "entry"],
        )
        for (surface, entry), (count, recorded) in self.throughput.counts.items():
            appends.add_metric([surface, entry], count)
            records.add_metric([surface, entry], recorded)
        yield appends
        yield records
        problems = CounterMetricFamily(
            "ductor_streams_problems",
            "Error answers by code (backpressure and quota-exhausted among them)",
            labels=["code"],
        )
        for code, count in self.problems.items():
            problems.add_metric([code], count)
        yield problems
        yield CounterMetricFamily(
            "ductor_streams_wake_bus_reconnects",
            "LISTEN reconnections since start",
            value=self.wake_reconnects,
        )
        yield CounterMetricFamily(
            "ductor_streams_gaps_repaired",
            "Streams that moved without a notification, repaired since start",
            value=self.gaps_repaired,
        )
        yield CounterMetricFamily(
            "ductor_streams_wake_connection_replacements",
            "LISTEN connections replaced because they went silent (heartbeats unanswered)",
            value=self.wake_replacements,
        )
        yield CounterMetricFamily(
            "ductor_streams_wake_bus_not_live",
            "Times the wake bus was not known to be alive and live delivery polled",
            value=self.wake_not_live,
        )
        yield CounterMetricFamily(
            "ductor_streams_live_tail_outages",
            "Times live delivery could not read the streams it follows (once per outage)",
            value=self.live_outages.episodes,
        )
        yield CounterMetricFamily(
            "ductor_streams_live_tail_read_failures",
            "Reads of live tails that failed (each retried, backing off up to 1 s)",
            value=self.live_outages.failures,
        )
        yield GaugeMetricFamily(
            "ductor_streams_live_tails_failing",
            "Live tails whose last read failed",
            value=len(self.live_outages.failing),
        )
        yield GaugeMetricFamily(
            "ductor_streams_wake_bus_live",
            "1 while the wake bus's connection is proven alive, 0 while followers poll",
            value=self.wake_live,
        )


HOT = HotPath()
REGISTRY.register(HOT)
_ids = itertools.count(1)
_ID_PREFIX = secrets.token_hex(6)


def new_request_id() -> str:
    """An id for a request that brought none: this process's prefix and a counter."""
    return f"{_ID_PREFIX}-{next(_ids):x}"


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

DRAIN_LIMIT = 64 * 1024 * 1024
# The largest Content-Length the HTTP servers in front pass on (a u64 in hyper, under granian):
# a longer one is refused before the application, so None below means "not declared".
MAX_CONTENT_LENGTH = 2**64 - 1
DRAIN_IDLE_SECONDS = 1.0
# After a 413 the connection is closed. Up to this much of the rest is still read first (for at
# most LINGER_SECONDS), so that a client that writes a body a little over the limit before
# reading gets its answer rather than a reset; a longer rest is not read at all.
LINGER_LIMIT = 16 * 1024 * 1024
LINGER_SECONDS = 5.0


def request_middleware(app: Any) -> Any:
    """Give each request an id (X-Request-ID, or a new one), time it by route template, and
    read what is left of a body the handler did not consume (refused before reading it),
    bounded, so that a client that writes its whole body before reading gets the answer rather
    than a reset connection. A body refused as too large closes the connection, and is read on
    only briefly (LINGER_LIMIT). With DUCTOR_STREAMS_LOG_LEVEL=DEBUG, each request is logged."""

    async def middleware(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        rid = None
        has_body = closing = False
        declared: int | None = None
        for name, value in scope.get("headers", ()):
            if name == b"x-request-id":
                rid = value.decode("latin-1")[:128]
            elif name == b"content-length":
                has_body = value not in (b"0", b"")
                declared = bounded_integer(value, MAX_CONTENT_LENGTH)
            elif name == b"transfer-encoding":
                has_body = True
            elif name == b"connection" and value.lower() == b"close":
                closing = True
        rid = rid or new_request_id()
        token = request_id.set(rid)
        status = 500
        started = time.perf_counter()
        body_done = not has_body
        received = 0
        drain_limit, drain_seconds = DRAIN_LIMIT, None

        async def tracking_receive() -> dict:
            nonlocal body_done, received
            message = await receive()
            received += len(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        async def send_with_id(message: dict) -> None:
            nonlocal status, drain_limit, drain_seconds
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [*message.get("headers", ()), (b"x-request-id", rid.encode())]
                if status == 413 and not body_done:
                    headers.append((b"connection", b"close"))
                    left = None if declared is None else declared - received
                    drain_limit = LINGER_LIMIT if left is None or left <= LINGER_LIMIT else 0
                    drain_seconds = LINGER_SECONDS
                message["headers"] = headers
            await send(message)

        try:
            await app(scope, tracking_receive if has_body else receive, send_with_id)
            drained = 0
            # A client that stops sending (it read the answer early) is not waited for long.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(drain_seconds):
                    while not body_done and not closing and drained < drain_limit:
                        async with asyncio.timeout(DRAIN_IDLE_SECONDS):
                            drained += len((await tracking_receive()).get("body", b""))
        finally:
            route = scope.get("path_template") or "unmatched"
            seconds = time.perf_counter() - started
            method = method_of(scope)
            HOT.observe(method, route, str(status), seconds)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%s %s %d %.1f ms", method, scope["path"], status, seconds * 1e3)
            request_id.reset(token)

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
