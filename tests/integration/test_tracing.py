"""Tracing end to end: a real server process exports its spans with the OTLP/HTTP exporter to a
small receiver here, which decodes the protobuf (opentelemetry-proto). A caller's `traceparent`
is the parent of the request's span on both surfaces, the use case, the group commit and the
PostgreSQL transaction descend from it, and the live delivery and the input dispatch are
linked to the append, in another process too."""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.conftest import BOOTSTRAP_TOKEN, SERVER_ENV
from tests.support.server import ServerProcess, WorkerProcess

SERVICE = "ductor-streams-traced"
TRACE_ID = secrets.token_hex(16)
CALLER_SPAN = secrets.token_hex(8)
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"


class Receiver:
    """An OTLP/HTTP traces endpoint: every span posted to /v1/traces, with its service name."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, Span]] = []
        self.paths: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.paths.append(self.path)
                request = ExportTraceServiceRequest.FromString(body)
                for resource in request.resource_spans:
                    names = [
                        a.value.string_value
                        for a in resource.resource.attributes
                        if a.key == "service.name"
                    ]
                    for scope in resource.scope_spans:
                        for span in scope.spans:
                            receiver.spans.append((names[0] if names else "", span))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def named(self, name: str) -> list[Span]:
        return [span for _, span in self.spans if span.name == name]

    async def wait_for(self, name: str, where: object = None, timeout: float = 10.0) -> Span:
        """The first span called `name` (and satisfying `where`, if given) to arrive."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for span in self.named(name):
                if where is None or where(span):  # type: ignore[operator]
                    return span
            await asyncio.sleep(0.05)
        raise AssertionError(f"no span {name!r}; got {sorted({s.name for _, s in self.spans})}")


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    yield receiver
    receiver.close()


@pytest.fixture(scope="module")
def traced_server(
    database_url: str, receiver: Receiver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    env = {
        **SERVER_ENV,
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_SERVICE_NAME": SERVICE,
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # export within 50 ms rather than 5 s
        "DUCTOR_STREAMS_LOG_LEVEL": "DEBUG",  # a line per request, to find the trace ids in
    }
    process = ServerProcess(
        database_url=database_url, data_dir=tmp_path_factory.mktemp("traced"), env=env
    ).start()
    # The input dispatcher in a process of its own: it hears from the server's transactions
    # which spans appended what (adapters/postgres/traces.py).
    worker = WorkerProcess(
        database_url=database_url, data_dir=tmp_path_factory.mktemp("traced-worker"), env=env
    ).start()
    yield process
    worker.stop()
    process.stop()


@pytest.fixture
async def http(traced_server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=traced_server.base_url,
        headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"},
        timeout=30,
    ) as client:
        yield client


def hex_id(raw: bytes) -> str:
    return raw.hex()


def child_of(span: Span, parent: Span) -> bool:
    return span.trace_id == parent.trace_id and span.parent_span_id == parent.span_id


def linked_to(span: Span, other: Span) -> bool:
    return any(link.span_id == other.span_id for link in span.links)


async def test_a_native_append_descends_from_the_callers_span_and_its_delivery_links_to_it(
    http: httpx.AsyncClient, receiver: Receiver, run_id: str, traced_server: ServerProcess
) -> None:
    base = f"/api/workflow-streams/runs/{run_id}/streams"
    assert (await http.post(base, json={"stream_id": "s", "direction": "output"})).is_success
    lines: asyncio.Queue[str] = asyncio.Queue()

    async def follow() -> None:
        async with http.stream("GET", f"{base}/s/subscribe", timeout=None) as answer:
            async for line in answer.aiter_lines():
                await lines.put(line)

    follower = asyncio.create_task(follow())
    try:
        async with asyncio.timeout(10):
            while await lines.get() != ": subscribed":
                pass
        appended = await http.post(
            f"{base}/s/records",
            json={"records": [{"data": "traced"}]},
            headers={"traceparent": TRACEPARENT},
        )
        assert appended.status_code == 201, appended.text
        async with asyncio.timeout(10):
            while await lines.get() != "id: 1":
                pass
    finally:
        follower.cancel()
    route = "POST /api/workflow-streams/runs/{run_id}/streams/{stream_id}/records"

    def ours(span: Span) -> bool:
        return hex_id(span.trace_id) == TRACE_ID

    request = await receiver.wait_for(route, ours)
    assert hex_id(request.parent_span_id) == CALLER_SPAN
    assert request.kind == Span.SPAN_KIND_SERVER
    use_case = await receiver.wait_for("append records", lambda s: child_of(s, request))
    commit = await receiver.wait_for("group commit", lambda s: child_of(s, use_case))
    transaction = await receiver.wait_for("postgresql transaction", lambda s: child_of(s, commit))
    assert transaction.kind == Span.SPAN_KIND_CLIENT
    delivered = await receiver.wait_for("live delivery", lambda s: linked_to(s, use_case))
    assert delivered.trace_id != request.trace_id or delivered.parent_span_id != use_case.span_id
    assert {name for name, _ in receiver.spans} == {SERVICE}
    assert all(path == "/v1/traces" for path in receiver.paths)
    # The request's log line names its trace and span.
    said = [json.loads(line) for line in traced_server.log().splitlines() if line.startswith("{")]
    [line] = [x for x in said if x.get("trace_id") == TRACE_ID and x["msg"].startswith("POST")]
    assert line["span_id"] == hex_id(request.span_id)


async def test_durable_streams_writes_descend_from_the_callers_span(
    http: httpx.AsyncClient, receiver: Receiver, run_id: str
) -> None:
    url = f"/api/durable-streams/v1/stream/{run_id}/notes"
    other_trace = secrets.token_hex(16)
    headers = {"traceparent": f"00-{other_trace}-{CALLER_SPAN}-01", "content-type": "text/plain"}
    assert (await http.put(url, content=b"a", headers=headers)).status_code == 201
    assert (await http.post(url, content=b"b", headers=headers)).status_code in (200, 204)

    def ours(span: Span) -> bool:
        return hex_id(span.trace_id) == other_trace

    create = await receiver.wait_for(
        "PUT /api/durable-streams/v1/stream/{run_id}/{stream_id}", ours
    )
    append = await receiver.wait_for(
        "POST /api/durable-streams/v1/stream/{run_id}/{stream_id}", ours
    )
    for request in (create, append):
        assert hex_id(request.parent_span_id) == CALLER_SPAN
    durable = await receiver.wait_for("create durable stream", lambda s: child_of(s, create))
    await receiver.wait_for("create stream", lambda s: child_of(s, durable))
    await receiver.wait_for("produce", lambda s: child_of(s, append))


async def test_the_input_dispatch_is_linked_to_the_append(
    http: httpx.AsyncClient, receiver: Receiver, run_id: str
) -> None:
    base = f"/api/workflow-streams/runs/{run_id}/streams"
    assert (await http.post(base, json={"stream_id": "in", "direction": "input"})).is_success
    third_trace = secrets.token_hex(16)
    appended = await http.post(
        f"{base}/in/records",
        json={"records": [{"data": {"go": True}}]},
        headers={"traceparent": f"00-{third_trace}-{CALLER_SPAN}-01"},
    )
    assert appended.status_code == 201, appended.text
    use_case = await receiver.wait_for(
        "append records", lambda s: hex_id(s.trace_id) == third_trace
    )
    commit = await receiver.wait_for("group commit", lambda s: child_of(s, use_case))
    transaction = await receiver.wait_for("postgresql transaction", lambda s: child_of(s, commit))
    # Dispatched by the worker process: linked to the transaction that appended the record, in
    # the append's trace.
    dispatched = await receiver.wait_for(
        "input dispatch", lambda s: linked_to(s, transaction), timeout=20
    )
    assert dispatched.kind == Span.SPAN_KIND_PRODUCER
    assert [hex_id(link.trace_id) for link in dispatched.links] == [third_trace]
