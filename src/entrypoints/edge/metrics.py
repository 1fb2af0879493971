"""The counters every request touches, kept per process as plain numbers and turned into
Prometheus metric families only when scraped (`HOT`), and the registry /metrics exposes."""

from __future__ import annotations

import bisect
import itertools
import secrets
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from application.live import TailOutages
from application.throughput import Throughput

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
        # The subscription wake deliverer's (application/subscriptions.py), when it runs here.
        self.webhook_attempts = 0
        self.webhook_failures = 0
        # Under `serve --workers N` (adapters/peers.py): appends sent to the process that
        # commits their stream, and appends committed here for another process.
        self.appends_forwarded = 0
        self.appends_received = 0
        # Statements that waited for their tenant's share of the pool (adapters/postgres/
        # bounded.py), copied here when /metrics is scraped.
        self.tenant_share_waits = 0
        self.tenant_turn_waits = 0
        self.tenant_turn_queue_full = 0
        self.tenant_answers_refused = 0

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
            "ductor_streams_webhook_attempts",
            "Webhook deliveries attempted by this process's wake deliverer",
            value=self.webhook_attempts,
        )
        yield CounterMetricFamily(
            "ductor_streams_tenant_share_waits",
            "Statements of a tenant's requests that waited for one of its places in the "
            "database pool (DUCTOR_STREAMS_POOL_TENANT_SHARE)",
            value=self.tenant_share_waits,
        )
        yield CounterMetricFamily(
            "ductor_streams_tenant_turn_waits",
            "Requests that waited for one of their tenant's turns at work in this process "
            "(DUCTOR_STREAMS_REQUESTS_AT_WORK_PER_TENANT)",
            value=self.tenant_turn_waits,
        )
        yield CounterMetricFamily(
            "ductor_streams_tenant_turn_queue_full",
            "Requests answered 429 at once: their tenant's requests waiting for a turn were "
            "at DUCTOR_STREAMS_REQUESTS_WAITING_PER_TENANT",
            value=self.tenant_turn_queue_full,
        )
        yield CounterMetricFamily(
            "ductor_streams_tenant_answers_refused",
            "Requests answered 429 at once: their tenant's answers not yet taken by their "
            "clients were at DUCTOR_STREAMS_MAX_ANSWER_BYTES_PER_TENANT",
            value=self.tenant_answers_refused,
        )
        yield CounterMetricFamily(
            "ductor_streams_webhook_failures",
            "Webhook deliveries that failed (retried with backoff) in this process",
            value=self.webhook_failures,
        )
        yield CounterMetricFamily(
            "ductor_streams_appends_forwarded",
            "Appends this process sent to the process of its host that commits their stream",
            value=self.appends_forwarded,
        )
        yield CounterMetricFamily(
            "ductor_streams_appends_received",
            "Appends another process of this host sent here to be committed",
            value=self.appends_received,
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
