"""Tracing in process, with the SDK's in-memory exporter: a caller's `traceparent` is the parent
of the request's span on both surfaces (the append front's routes too), the use case and the
group commit are its children, the live delivery and the input dispatch are linked to the
append, log lines carry the ids, and off nothing is traced at all."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import AsyncIterator, Iterator

import pytest
from litestar.testing import AsyncTestClient
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from application import tracing
from application.access import SCOPES
from application.live import RecordsDelivered
from application.tokens import IssueToken, make_caller
from domain.stream import StreamKey
from entrypoints import tracing as exporting
from entrypoints.config import Settings
from entrypoints.container import memory_container
from entrypoints.http.app import create_app
from entrypoints.logs import JsonFormatter

# Building the application in process reports Litestar's deprecation of inferred path
# parameters for every route; not what these tests are about.
pytestmark = pytest.mark.filterwarnings(
    "ignore::litestar.exceptions.base_exceptions.LitestarDeprecationWarning"
)

TOKEN = "dst_tracing_" + secrets.token_hex(8)
TRACE_ID = secrets.token_hex(16)
CALLER_SPAN = secrets.token_hex(8)
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
NATIVE_APPEND = "POST /api/workflow-streams/runs/{run_id}/streams/{stream_id}/records"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    assert exporting.configure({}, exporter=spans)
    try:
        yield spans
    finally:
        exporting.shutdown()


@pytest.fixture
async def client(exporter: InMemorySpanExporter) -> AsyncIterator[AsyncTestClient]:
    container = memory_container(Settings())
    app = create_app(container)  # built while tracing is on: the request spans are installed
    async with AsyncTestClient(app) as client:
        caller = make_caller("default", "bootstrap", list(SCOPES))
        await IssueToken(container.tokens())(caller, TOKEN)
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        client.app.state.container = container
        yield client


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def only(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    [span] = named(exporter, name)
    return span


def child_of(span: ReadableSpan, parent: ReadableSpan) -> bool:
    return span.parent is not None and span.parent.span_id == parent.context.span_id


def linked_to(span: ReadableSpan, other: ReadableSpan) -> bool:
    return any(link.context.span_id == other.context.span_id for link in span.links)


async def test_a_native_append_is_a_child_of_the_callers_span_down_to_its_commit(
    client: AsyncTestClient, exporter: InMemorySpanExporter
) -> None:
    base = "/api/workflow-streams/runs/r1/streams"
    assert (await client.post(base, json={"stream_id": "s", "direction": "output"})).is_success
    exporter.clear()
    answer = await client.post(
        f"{base}/s/records", json={"records": [{"data": 1}]}, headers={"traceparent": TRACEPARENT}
    )
    assert answer.status_code == 201, answer.text
    request = only(exporter, NATIVE_APPEND)
    assert format(request.context.trace_id, "032x") == TRACE_ID
    assert request.parent is not None and format(request.parent.span_id, "016x") == CALLER_SPAN
    assert request.attributes["http.response.status_code"] == 201
    use_case = only(exporter, "append records")
    assert child_of(use_case, request)
    assert child_of(only(exporter, "group commit"), use_case)


async def test_a_route_of_the_router_takes_the_callers_span_too(
    client: AsyncTestClient, exporter: InMemorySpanExporter
) -> None:
    answer = await client.get(
        "/api/workflow-streams/runs/r2/streams", headers={"traceparent": TRACEPARENT}
    )
    assert answer.status_code == 404  # no such run: answered, and traced, all the same
    request = only(exporter, "GET /api/workflow-streams/runs/{run_id}/streams")
    assert format(request.parent.span_id, "016x") == CALLER_SPAN  # type: ignore[union-attr]
    assert request.attributes["http.response.status_code"] == 404


async def test_a_durable_streams_create_and_append_are_children_of_the_callers_span(
    client: AsyncTestClient, exporter: InMemorySpanExporter
) -> None:
    url = "/api/durable-streams/v1/stream/r3/d"
    headers = {"traceparent": TRACEPARENT, "content-type": "text/plain"}
    assert (await client.put(url, content=b"a", headers=headers)).status_code == 201
    assert (await client.post(url, content=b"b", headers=headers)).status_code in (200, 204)
    create = only(exporter, "PUT /api/durable-streams/v1/stream/{run_id}/{stream_id}")
    append = only(exporter, "POST /api/durable-streams/v1/stream/{run_id}/{stream_id}")
    for request in (create, append):
        assert format(request.parent.span_id, "016x") == CALLER_SPAN  # type: ignore[union-attr]
    durable_create = only(exporter, "create durable stream")
    assert child_of(durable_create, create)
    assert child_of(only(exporter, "create stream"), durable_create)
    assert child_of(only(exporter, "produce"), append)


@pytest.mark.parametrize(
    ("method", "path", "use_case"),
    [
        ("GET", "/streams/s", "get stream"),
        ("GET", "/streams/s/records?cursor=0", "read records"),
        ("GET", "/streams", "list streams"),
        ("POST", "/streams/s/close", "close stream"),
        ("DELETE", "/streams/s", "delete stream"),
    ],
)
async def test_each_use_case_is_a_span_of_its_own_under_the_request(
    client: AsyncTestClient, exporter: InMemorySpanExporter, method: str, path: str, use_case: str
) -> None:
    base = "/api/workflow-streams/runs/r5"
    created = await client.post(f"{base}/streams", json={"stream_id": "s", "direction": "output"})
    assert created.is_success, created.text
    exporter.clear()
    answer = await client.request(method, base + path, headers={"traceparent": TRACEPARENT})
    assert answer.is_success, answer.text
    [request] = [s for s in exporter.get_finished_spans() if s.name.startswith(method + " ")]
    assert child_of(only(exporter, use_case), request)


async def test_a_malformed_traceparent_starts_a_trace_of_our_own(
    client: AsyncTestClient, exporter: InMemorySpanExporter
) -> None:
    answer = await client.get("/healthz", headers={"traceparent": "00-nonsense-01"})
    assert answer.status_code == 200
    [request] = exporter.get_finished_spans()
    assert request.parent is None


async def test_the_live_delivery_is_linked_to_the_append_that_brought_its_records(
    client: AsyncTestClient, exporter: InMemorySpanExporter
) -> None:
    base = "/api/workflow-streams/runs/r5/streams"
    assert (await client.post(base, json={"stream_id": "s", "direction": "output"})).is_success
    tails = client.app.state.container.tails()
    follow = tails.follow(StreamKey("default", "r5", "s"), 0, 60.0)
    first = asyncio.ensure_future(anext(follow))
    await asyncio.sleep(0.05)  # the tail has read the head
    answer = await client.post(
        f"{base}/s/records", json={"records": [{"data": 1}]}, headers={"traceparent": TRACEPARENT}
    )
    assert answer.status_code == 201
    delivery = await asyncio.wait_for(first, 5)
    assert isinstance(delivery, RecordsDelivered)
    await follow.aclose()  # the delivery's span ends when the follower is done with it
    delivered = only(exporter, "live delivery")
    assert linked_to(delivered, only(exporter, "append records"))
    assert delivered.attributes["ductor_streams.last_sequence"] == 1


async def test_the_input_dispatch_is_linked_to_the_append(
    client: AsyncTestClient, exporter: InMemorySpanExporter
) -> None:
    base = "/api/workflow-streams/runs/r6/streams"
    assert (await client.post(base, json={"stream_id": "in", "direction": "input"})).is_success
    answer = await client.post(
        f"{base}/in/records",
        json={"records": [{"data": {"go": True}}]},
        headers={"traceparent": TRACEPARENT},
    )
    assert answer.status_code == 201, answer.text
    container = client.app.state.container
    [job] = await container.input_deliveries().claim(1)
    await container.dispatch().run_job(job)
    dispatched = only(exporter, "input dispatch")
    assert linked_to(dispatched, only(exporter, "append records"))
    assert dispatched.attributes["ductor_streams.sequence"] == 1


def test_log_lines_carry_the_trace_and_span_ids(exporter: InMemorySpanExporter) -> None:
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "inside", None, None)
    with tracing.span("work") as span:
        assert span is not None
        line = json.loads(JsonFormatter().format(record))
    context = span.get_span_context()
    assert line["trace_id"] == format(context.trace_id, "032x")
    assert line["span_id"] == format(context.span_id, "016x")


def test_off_nothing_is_traced_or_installed() -> None:
    assert not exporting.configure({"OTEL_SERVICE_NAME": "x"})  # no endpoint: stays off
    assert not tracing.on()
    assert tracing.span("x") is tracing.OFF and tracing.current() is None
    assert tracing.start("x") is None
    app = create_app(memory_container(Settings()))
    assert app.asgi_handler.__name__ != "traced"
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "outside", None, None)
    assert "trace_id" not in json.loads(JsonFormatter().format(record))


def test_an_endpoint_turns_it_on() -> None:
    assert exporting.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert exporting.wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert not exporting.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": " "})
    assert not exporting.wanted({})


def test_another_process_announcement_is_recorded_and_our_own_or_a_malformed_one_is_not(
    exporter: InMemorySpanExporter,
) -> None:
    from adapters.postgres.traces import ORIGIN, heard_trace, trace_announcement

    key = StreamKey("t", "r", "announced")
    theirs = trace_announcement(key, 3, 5, TRACEPARENT).replace(ORIGIN, "another", 1)
    heard_trace(theirs)
    [context] = tracing.APPENDS.of(key, 5, 9)
    assert format(context.trace_id, "032x") == TRACE_ID
    assert format(context.span_id, "016x") == CALLER_SPAN
    assert tracing.APPENDS.of(key, 6, 9) == []
    mine = StreamKey("t", "r", "mine")
    heard_trace(trace_announcement(mine, 1, 1, TRACEPARENT))
    for bad in ("another t/r/x 1 2", "another t/r 1 1 " + TRACEPARENT, "another t/r/x 1 1 00-zz"):
        heard_trace(bad)
    assert tracing.APPENDS.of(mine, 1, 1) == []
    assert tracing.APPENDS.of(StreamKey("t", "r", "x"), 1, 2) == []


def test_append_traces_stay_bounded() -> None:
    from opentelemetry.trace import SpanContext

    traces = tracing.AppendTraces(per_stream=2, streams=2)
    context = SpanContext(1, 2, is_remote=False)
    keys = [StreamKey("t", "r", f"s{i}") for i in range(3)]
    for key in keys:
        for sequence in (1, 2, 3):
            traces.appended(key, sequence, sequence, context)
    assert traces.of(keys[0], 1, 3) == []  # the least recently appended stream, forgotten
    assert traces.of(keys[2], 1, 3) == [context, context]  # its two latest appends


def test_records_read_before_their_batch_has_learnt_its_sequences_link_to_its_appends() -> None:
    """The commit's notification can wake a follower, whose delivery then reads the records,
    before the leader resumes to record which sequences each append got."""
    from opentelemetry.trace import SpanContext

    traces = tracing.AppendTraces()
    key = StreamKey("t", "r", "s")
    earlier, first, second = (SpanContext(1, n, is_remote=False) for n in (1, 2, 3))
    traces.appended(key, 1, 4, earlier)
    traces.committing(key, [first, second])
    assert traces.of(key, 5, 6) == [first, second]  # past every sequence recorded: theirs
    assert traces.of(key, 4, 6) == [earlier, first, second]
    assert traces.of(key, 2, 3) == [earlier]  # recorded already: not theirs
    traces.committed(key)
    traces.appended(key, 5, 5, first)
    assert traces.of(key, 5, 6) == [first]
    fresh = StreamKey("t", "r", "new")  # nothing recorded yet
    traces.committing(fresh, [second])
    assert traces.of(fresh, 1, 1) == [second]
