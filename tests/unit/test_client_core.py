"""The client's sans-IO core through both drivers, over `httpx.MockTransport`: errors by code,
retry decisions, Retry-After, jitter, typed answers and follow()'s events and resumption."""

from __future__ import annotations

import contextlib
import inspect
import json
import random
import typing
import warnings
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import msgspec
import pytest

import ductor_streams_client as client_lib
from ductor_streams_client import (
    CLASS_OF_CODE,
    AppendAnswer,
    Backpressure,
    Closed,
    CursorExpired,
    Deleted,
    Gone,
    InvalidInput,
    NotFound,
    Record,
    RetryPolicy,
    Revoked,
    StreamsClient,
    StreamsConnectionError,
    StreamsError,
    SyncStreamsClient,
    Unavailable,
)
from ductor_streams_client._core import Call, Exchange, Retry
from ductor_streams_client.errors import parse_retry_after
from entrypoints.http.problems import STATUS_OF_CODE

BASE = "http://streams.test"
FAST = RetryPolicy(attempts=5, total_seconds=30, base_delay=0.001, max_delay=0.002)
CREDIT = {"unread_items": 1, "unread_bytes": 9, "max_unread_items": 10, "max_unread_bytes": 99}
APPENDED = {"first_sequence": 1, "last_sequence": 1, "head": 1, "credit": CREDIT}
Handler = Callable[[httpx.Request], httpx.Response]


def problem(code: str, status: int | None = None, **extra: Any) -> httpx.Response:
    status = status or STATUS_OF_CODE.get(code, 400)
    body = {"type": "x", "title": code, "status": status, "detail": f"{code}!", "code": code}
    headers = {"Retry-After": "0"} if status in (429, 503) else {}
    return httpx.Response(status, json={**body, **extra}, headers=headers)


class Driver:
    """Runs one client method through the async or the sync client, over one mock handler."""

    def __init__(self, kind: str, handler: Handler, policy: RetryPolicy = FAST) -> None:
        self.kind = kind
        self.requests: list[httpx.Request] = []

        def recording(request: httpx.Request) -> httpx.Response:
            request.read()
            self.requests.append(request)
            return handler(request)

        self.handler = recording
        self.policy = policy

    def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self.kind == "sync":
            with SyncStreamsClient(
                BASE, "tok", retry=self.policy, transport=httpx.MockTransport(self.handler)
            ) as sync:
                result = getattr(sync, method)(*args, **kwargs)
                return list(result) if isinstance(result, Iterator) else result

        async def go() -> Any:
            async with StreamsClient(
                BASE, "tok", retry=self.policy, transport=httpx.MockTransport(self.handler)
            ) as client:
                result = getattr(client, method)(*args, **kwargs)
                if hasattr(result, "__aiter__"):
                    return [item async for item in result]
                return await result

        import asyncio

        return asyncio.run(go())


@pytest.fixture(params=["async", "sync"])
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


# -- errors ------------------------------------------------------------------------------------


def test_every_contract_code_has_its_own_class() -> None:
    for code in STATUS_OF_CODE:
        kind = CLASS_OF_CODE[code]
        assert kind is not StreamsError and issubclass(kind, StreamsError), code
        assert kind.code_of_class == code
        assert getattr(client_lib, kind.__name__) is kind  # exported
    assert len(set(CLASS_OF_CODE.values())) == len(CLASS_OF_CODE)


@pytest.mark.parametrize("code", list(STATUS_OF_CODE))
def test_a_problem_raises_the_class_of_its_code(kind: str, code: str) -> None:
    drive = Driver(kind, lambda _: problem(code), RetryPolicy.none())
    with pytest.raises(StreamsError) as caught:
        drive("get_stream", "r", "s")
    error = caught.value
    assert type(error) is CLASS_OF_CODE[code]
    assert (error.status, error.code, error.detail) == (STATUS_OF_CODE[code], code, f"{code}!")
    assert error.problem["code"] == code
    assert str(error) == f"{error.status} {code}: {code}!"


def test_an_unknown_code_or_a_body_that_is_no_problem_is_the_base_class(kind: str) -> None:
    drive = Driver(kind, lambda _: problem("brand-new-code", 418), RetryPolicy.none())
    with pytest.raises(StreamsError) as caught:
        drive("get_stream", "r", "s")
    assert type(caught.value) is StreamsError and caught.value.code == "brand-new-code"

    drive = Driver(kind, lambda _: httpx.Response(500, text="boom"), RetryPolicy.none())
    with pytest.raises(StreamsError) as caught:
        drive("get_stream", "r", "s")
    assert type(caught.value) is StreamsError
    assert (caught.value.code, caught.value.detail) == ("http-500", "boom")


def test_the_extra_fields_of_a_code_are_attributes(kind: str) -> None:
    expired = problem("cursor-expired", requested=3, earliest=7, latest=9, reason="retention")
    with pytest.raises(CursorExpired) as caught:
        Driver(kind, lambda _: expired)("read", "r", "s", cursor=2)
    error = caught.value
    assert (error.requested, error.earliest, error.latest, error.reason) == (
        3,
        7,
        9,
        "retention",
    )
    bad = problem("invalid-input", field="limit")
    with pytest.raises(InvalidInput) as invalid:
        Driver(kind, lambda _: bad)("read", "r", "s")
    assert invalid.value.field == "limit"


def test_errors_survive_pickling() -> None:
    import pickle

    error = CLASS_OF_CODE["backpressure"](429, "backpressure", "full", {"a": 1}, retry_after=2.0)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is Backpressure and again.retry_after == 2.0 and again.problem == {"a": 1}


def test_connection_refused_is_a_connection_error_after_the_retries(kind: str) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    drive = Driver(kind, refuse)
    with pytest.raises(StreamsConnectionError) as caught:
        drive("get_stream", "r", "s")
    assert (caught.value.status, caught.value.code) == (0, "connection-error")
    assert len(drive.requests) == FAST.attempts


# -- retry decisions -------------------------------------------------------------------------------


def sequence_of(*answers: httpx.Response | type[Exception]) -> Handler:
    """A handler that answers these in turn (an exception class is raised), then the last."""
    queue = list(answers)

    def handler(request: httpx.Request) -> httpx.Response:
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(answer, type):
            raise answer("simulated", request=request)
        return answer

    return handler


def test_nothing_done_answers_are_retried_then_succeed(kind: str) -> None:
    ok = httpx.Response(201, json=APPENDED)
    drive = Driver(kind, sequence_of(problem("unavailable"), problem("backpressure"), ok))
    answer = drive("append", "r", "s", [{"n": 1}])
    assert isinstance(answer, AppendAnswer) and answer.credit.max_unread_items == 10
    assert len(drive.requests) == 3
    keys = {r.headers["idempotency-key"] for r in drive.requests}
    assert len(keys) == 1  # every retry reused the call's key


def test_a_lost_answer_is_retried_only_when_repeating_is_harmless(kind: str) -> None:
    ok = httpx.Response(201, json=APPENDED)
    # An append always carries an idempotency key: retried after a reset.
    drive = Driver(kind, sequence_of(httpx.ReadError, ok))
    drive("append", "r", "s", ["x"], idempotency_key="mine")
    assert [r.headers["idempotency-key"] for r in drive.requests] == ["mine", "mine"]
    # A create without a stream ID would make a second stream: not retried after a reset ...
    drive = Driver(kind, sequence_of(httpx.ReadError, ok))
    with pytest.raises(StreamsConnectionError):
        drive("create_stream", "r")
    assert len(drive.requests) == 1
    # ... nor after a 502 (the gateway may have passed it on); with an ID it is.
    drive = Driver(kind, sequence_of(httpx.Response(502), ok))
    with pytest.raises(StreamsError) as caught:
        drive("create_stream", "r")
    assert caught.value.status == 502 and len(drive.requests) == 1
    drive = Driver(kind, sequence_of(httpx.Response(502), httpx.ReadError, document_answer()))
    assert drive("create_stream", "r", "s").stream_id == "s"
    assert len(drive.requests) == 3
    # A connection that never opened sent nothing: retried whatever the call.
    drive = Driver(kind, sequence_of(httpx.ConnectError, document_answer()))
    drive("create_stream", "r")
    assert len(drive.requests) == 2


def test_refusals_are_not_retried(kind: str) -> None:
    drive = Driver(kind, lambda _: problem("stream-closed"))
    with pytest.raises(client_lib.StreamClosed):
        drive("append", "r", "s", ["x"])
    assert len(drive.requests) == 1


def test_attempts_and_total_time_bound_the_retries(kind: str) -> None:
    drive = Driver(kind, lambda _: problem("unavailable"), RetryPolicy(attempts=3, base_delay=0))
    with pytest.raises(Unavailable):
        drive("get_stream", "r", "s")
    assert len(drive.requests) == 3

    def far(_: httpx.Request) -> httpx.Response:
        answer = problem("backpressure")
        answer.headers["Retry-After"] = "120"
        return answer

    drive = Driver(kind, far, RetryPolicy(attempts=10, total_seconds=5))
    with pytest.raises(Backpressure) as caught:
        drive("append", "r", "s", ["x"])
    assert caught.value.retry_after == 120 and len(drive.requests) == 1  # gave up at once


def test_a_delete_retried_after_a_lost_answer_that_finds_nothing_succeeded(kind: str) -> None:
    drive = Driver(kind, sequence_of(httpx.ReadError, problem("not-found")))
    assert drive("delete_stream", "r", "s") is None
    assert [r.method for r in drive.requests] == ["DELETE", "DELETE"]
    drive = Driver(kind, lambda _: problem("not-found"))
    with pytest.raises(NotFound):  # the first try finding nothing is a real 404
        drive("delete_run", "r")


@pytest.mark.parametrize("first", ["unavailable", "refused"])
def test_a_delete_that_finds_nothing_after_tries_that_did_nothing_is_a_real_404(
    kind: str, first: str
) -> None:
    # A 503 (or a connection that never opened) says the first try did nothing: the 404 of
    # the retry is the stream never having been there, not the delete having worked.
    did_nothing = problem("unavailable") if first == "unavailable" else httpx.ConnectError
    drive = Driver(kind, sequence_of(did_nothing, problem("not-found")))
    with pytest.raises(NotFound):
        drive("delete_stream", "r", "s")
    assert len(drive.requests) == 2


def test_a_503_of_unknown_outcome_is_retried_only_when_repeating_is_safe(kind: str) -> None:
    unknown = problem("unavailable", outcome="unknown")
    drive = Driver(kind, sequence_of(unknown, document_answer()))
    with pytest.raises(Unavailable):  # a stream named by the service: a repeat could make two
        drive("create_stream", "r", None)
    assert len(drive.requests) == 1
    drive = Driver(kind, sequence_of(unknown, httpx.Response(200, json=APPENDED)))
    drive("append", "r", "s", ["x"])  # an append always carries an Idempotency-Key
    assert len(drive.requests) == 2
    assert (
        drive.requests[0].headers["idempotency-key"] == drive.requests[1].headers["idempotency-key"]
    )


def test_exchange_steps_with_an_injected_clock() -> None:
    now = [0.0]
    call = Call("GET", "/x")
    exchange = Exchange(
        call,
        RetryPolicy(attempts=10, total_seconds=10, base_delay=1, max_delay=4),
        BASE,
        clock=lambda: now[0],
        rng=random.Random(7),
    )
    request = httpx.Request("GET", BASE + "/x")
    delays = []
    for _ in range(4):
        exchange.attempt()
        step = exchange.failed(httpx.ConnectError("refused", request=request))
        assert isinstance(step, Retry)
        delays.append(step.delay)
        now[0] += step.delay
    assert all(0 <= d <= cap for d, cap in zip(delays, (1, 2, 4, 4), strict=True))
    now[0] = 9.99
    exchange.attempt()
    with pytest.raises(StreamsConnectionError):  # any delay would end past total_seconds
        while True:
            step = exchange.failed(httpx.ConnectError("refused", request=request))
            now[0] += step.delay
            exchange.attempt()


# -- Retry-After and jitter ------------------------------------------------------------------------


def test_retry_after_in_seconds_or_as_an_http_date() -> None:
    now = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("3", now) == 3.0
    assert parse_retry_after(" 0 ", now) == 0.0
    assert parse_retry_after("Sun, 01 Mar 2026 12:00:30 GMT", now) == 30.0
    assert parse_retry_after("Sun, 01 Mar 2026 11:00:00 GMT", now) == 0.0  # past: at once
    for bad in (None, "", "soon", "-1", "1.5", "²"):
        assert parse_retry_after(bad, now) is None


def test_an_http_date_retry_after_is_honoured(kind: str) -> None:
    later = httpx.Response(503, json={"code": "unavailable", "detail": "x"})
    later.headers["Retry-After"] = "Thu, 01 Jan 1970 00:00:00 GMT"  # in the past: retry now
    drive = Driver(kind, sequence_of(later, document_answer()))
    assert drive("get_stream", "r", "s").stream_id == "s"
    assert len(drive.requests) == 2


def test_full_jitter_stays_within_the_exponential_cap() -> None:
    policy = RetryPolicy(base_delay=0.1, max_delay=2.0)
    rng = random.Random(1)
    assert [policy.cap(n) for n in range(1, 8)] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    for retry in range(1, 12):
        samples = [policy.backoff(retry, rng) for _ in range(500)]
        assert all(0.0 <= s <= policy.cap(retry) for s in samples)
        # full jitter: spread over the whole range, not clustered at the cap
        assert min(samples) < policy.cap(retry) * 0.1 and max(samples) > policy.cap(retry) * 0.9


def test_a_policy_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(base_delay=-1)
    assert RetryPolicy.none().attempts == 1


# -- typed answers ---------------------------------------------------------------------------------


def document_answer(stream_id: str = "s") -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "stream_id": stream_id,
            "run_id": "r",
            "direction": "output",
            "content_class": "application_data",
            "schema": None,
            "limits": {
                "max_unread_items": 10,
                "max_unread_bytes": 99,
                "max_total_items": None,
                "max_total_bytes": None,
                "unread_policy": "reject",
                "block_timeout_seconds": 0.5,
            },
            "retention": {"max_age_seconds": None, "max_records": 5},
            "redaction": {"json_pointers": ["/secret"]},
            "placement": {
                "metadata_home": "local",
                "metadata_replicas": [],
                "object_regions": ["local"],
                "client_egress_regions": ["local"],
                "log_region": "local",
            },
            "authorization": {"readers": ["*"], "writers": ["me"]},
            "expiry": {"idle_seconds": 60, "expires_at": None},
            "created_at": "2026-12-01T10:00:00Z",
            "state": {
                "head": 0,
                "earliest": 1,
                "closed": False,
                "closed_at": None,
                "legal_hold": {"enabled": False, "reason": None, "updated_at": None},
                "total_items": 0,
                "total_bytes": 0,
                "consumers": [{"consumer_id": "ui", "acked_sequence": 0}],
                "credit": CREDIT,
                "open_objects": [],
                "future_field": "ignored",
            },
        },
    )


def test_close_stream_closes_and_the_old_close_with_a_stream_warns_but_still_does(
    kind: str,
) -> None:
    driver = Driver(kind, lambda _: document_answer())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the name to use warns nothing
        assert driver("close_stream", "r", "s").stream_id == "s"
    if kind == "async":  # the sync client's close() closes the client, as it always did
        with pytest.warns(DeprecationWarning, match=r"close_stream\(run_id, stream_id\)"):
            assert driver("close", "r", "s").stream_id == "s"
    assert [(r.method, r.url.path) for r in driver.requests] == [
        ("POST", "/api/workflow-streams/runs/r/streams/s/close")
    ] * (2 if kind == "async" else 1)


def test_answers_are_frozen_typed_structs(kind: str) -> None:
    document = Driver(kind, lambda _: document_answer())("get_stream", "r", "s")
    assert document.limits.block_timeout_seconds == 0.5
    assert document.retention.max_records == 5 and document.expiry.idle_seconds == 60
    assert document.authorization.writers == ("me",)
    assert document.state.consumers[0].consumer_id == "ui"
    assert document.state.input_delivery is None
    assert document.created_at == datetime(2026, 12, 1, 10, tzinfo=UTC)
    with pytest.raises(AttributeError):
        document.stream_id = "other"  # type: ignore[misc]
    plain = msgspec.to_builtins(document)
    assert plain["created_at"] == "2026-12-01T10:00:00Z" and plain["state"]["head"] == 0


def test_an_answer_of_the_wrong_shape_is_an_unexpected_answer(kind: str) -> None:
    drive = Driver(kind, lambda _: httpx.Response(200, json={"stream_id": 5}))
    with pytest.raises(client_lib.UnexpectedAnswer):
        drive("get_stream", "r", "s")


def test_create_sends_only_what_was_given(kind: str) -> None:
    drive = Driver(kind, lambda _: document_answer())
    drive(
        "create_stream",
        "r",
        "s",
        limits=client_lib.Limits(max_unread_items=10),
        expiry={"idle_seconds": 60},
    )
    body = json.loads(drive.requests[0].content)
    assert body == {
        "direction": "output",
        "stream_id": "s",
        "limits": {"max_unread_items": 10},
        "expiry": {"idle_seconds": 60},
    }
    assert drive.requests[0].headers["authorization"] == "Bearer tok"


def test_records_have_data_bytes_or_object() -> None:
    page = msgspec.json.decode(
        json.dumps(
            {
                "records": [
                    {
                        "sequence": 1,
                        "appended_at": "2026-01-01T00:00:00Z",
                        "size": 4,
                        "content_type": "application/json",
                        "data": None,
                    },
                    {
                        "sequence": 2,
                        "appended_at": "2026-01-01T00:00:00Z",
                        "size": 3,
                        "content_type": "application/octet-stream",
                        "data_base64": "AAFy",
                    },
                    {
                        "sequence": 3,
                        "appended_at": "2026-01-01T00:00:00Z",
                        "size": 9,
                        "content_type": "image/png",
                        "object": {
                            "object_id": "obj-1",
                            "size": 9,
                            "sha256": "ab",
                            "content_type": "image/png",
                            "schema": None,
                        },
                    },
                ],
                "next_cursor": 3,
                "head": 3,
                "earliest": 1,
                "closed": False,
            }
        ),
        type=client_lib.RecordsPage,
    )
    json_record, binary, carried = page.records
    assert (json_record.kind, json_record.data, json_record.bytes) == ("json", None, None)
    assert (binary.kind, binary.bytes) == ("bytes", b"\x00\x01r")
    assert carried.kind == "object" and carried.object is not None
    assert carried.object.object_id == "obj-1" and carried.bytes is None


def test_http_client_of_the_caller_is_used_and_left_open() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return document_answer()

    with httpx.Client(transport=httpx.MockTransport(handler), headers={"X-Mine": "1"}) as mine:
        with SyncStreamsClient(BASE + "/api/workflow-streams", "tok", http_client=mine) as c:
            c.get_stream("r", "s")
        assert not mine.is_closed
        assert seen[0].headers["x-mine"] == "1"
        assert str(seen[0].url) == BASE + "/api/workflow-streams/runs/r/streams/s"

    async def go() -> None:
        transport = httpx.MockTransport(handler)
        async with httpx.AsyncClient(transport=transport) as mine:
            async with StreamsClient(BASE, None, http_client=mine) as c:
                await c.get_stream("r", "s")
            assert not mine.is_closed
        assert "authorization" not in seen[-1].headers  # token=None sends none

    import asyncio

    asyncio.run(go())


def test_put_object_retries_a_replayable_body_but_not_a_stream(kind: str) -> None:
    body = b"x" * 300_000
    intent = {
        "object_id": "obj-1",
        "state": "prepared",
        "size": len(body),
        "sha256": "00",
        "content_type": "application/octet-stream",
        "schema": None,
        "expires_at": None,
        "created_at": "2026-01-01T00:00:00Z",
        "sequence": None,
        "upload": {
            "method": "PUT",
            "url": "/api/workflow-streams/runs/r/streams/s/objects/obj-1/body",
        },
    }
    uploads: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/objects"):
            return httpx.Response(201, json=intent)
        if request.url.path.endswith("/body"):
            uploads.append(request.content)
            if len(uploads) == 1:
                return problem("unavailable")
            return httpx.Response(200, json={**intent, "state": "uploaded", "upload": None})
        return httpx.Response(201, json={"sequence": 7, "object_id": "obj-1"})

    drive = Driver(kind, handler)
    progress: list[tuple[int, int]] = []
    answer = drive(
        "put_object", "r", "s", body, progress=lambda sent, total: progress.append((sent, total))
    )
    assert (answer.sequence, answer.object_id) == (7, "obj-1")
    assert uploads == [body, body]  # the retry sent the whole body again
    assert progress[-1] == (len(body), len(body))

    uploads.clear()
    if kind == "sync":
        chunks: Any = iter([body])
    else:

        async def agen() -> Any:
            yield body

        chunks = agen()
    with pytest.raises(Unavailable):
        drive("put_object", "r", "s", chunks, size=len(body), sha256="00")
    assert len(uploads) == 1  # read once: never sent again


def test_put_object_whose_lost_upload_landed_goes_on_to_commit(kind: str) -> None:
    intent = {
        "object_id": "obj-1",
        "state": "prepared",
        "size": 1,
        "sha256": "00",
        "content_type": "application/octet-stream",
        "schema": None,
        "expires_at": None,
        "created_at": "2026-01-01T00:00:00Z",
        "sequence": None,
        "upload": None,
    }
    puts = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/objects"):
            return httpx.Response(201, json=intent)
        if request.method == "PUT":
            puts.append(1)
            if len(puts) == 1:
                raise httpx.ReadError("lost", request=request)
            return problem("object-state-conflict")
        if request.method == "GET":
            return httpx.Response(200, json={**intent, "state": "uploaded"})
        return httpx.Response(201, json={"sequence": 1, "object_id": "obj-1"})

    drive = Driver(kind, handler)
    assert drive("put_object", "r", "s", b"x").sequence == 1
    assert [r.method for r in drive.requests] == ["POST", "PUT", "PUT", "GET", "POST"]


# -- follow ----------------------------------------------------------------------------------------


def record_event(sequence: int, data: Any) -> str:
    record = {
        "sequence": sequence,
        "appended_at": "2026-01-01T00:00:00Z",
        "size": 1,
        "content_type": "application/json",
        "data": data,
    }
    return f"id: {sequence}\nevent: record\ndata: {json.dumps(record)}\n\n"


def sse(*events: str) -> httpx.Response:
    return httpx.Response(
        200,
        headers={"content-type": "text/event-stream; charset=utf-8"},
        content=(": subscribed\n\n" + "".join(events)).encode(),
    )


def test_follow_yields_typed_records_resumes_and_ends_with_the_event(kind: str) -> None:
    answers = iter(
        [
            sse(record_event(1, "a"), record_event(2, "b")),  # ends short: reconnect
            problem("unavailable"),  # a stopping server: retried
            sse(
                record_event(2, "b"),
                ": keep-alive\n\n",
                record_event(3, "c"),
                'event: closed\ndata: {"head": 3}\n\n',
            ),
        ]
    )
    drive = Driver(kind, lambda _: next(answers))
    reconnects: list[str] = []
    items = drive(
        "follow", "r", "s", on_reconnect=lambda failure, _: reconnects.append(failure.code)
    )
    assert [type(i) for i in items] == [Record, Record, Record, Closed]
    assert [i.data for i in items[:3]] == ["a", "b", "c"]  # the repeated 2 is not delivered
    assert items[-1] == Closed(head=3)
    assert reconnects == ["connection-error", "unavailable"]
    resumed = [r.headers["last-event-id"] for r in drive.requests]
    assert resumed == ["0", "2", "2"]
    assert drive.requests[1].url.params["cursor"] == "2"


@pytest.mark.parametrize(
    ("event", "data", "final", "raised"),
    [
        (
            "gone",
            '{"requested": 2, "earliest": 5, "latest": 9, "reason": "retention"}',
            Gone(requested=2, earliest=5, latest=9),
            CursorExpired,
        ),
        ("deleted", "{}", Deleted(), NotFound),
        ("revoked", "{}", Revoked(), client_lib.Unauthenticated),
    ],
)
def test_follow_final_events(kind: str, event: str, data: str, final: Any, raised: type) -> None:
    def handler(_: httpx.Request) -> httpx.Response:
        return sse(record_event(1, "a"), f"event: {event}\ndata: {data}\n\n", record_event(2, "x"))

    items = Driver(kind, handler)("follow", "r", "s")
    assert items[-1] == final and len(items) == 2
    with pytest.raises(raised) as caught:
        Driver(kind, handler)("follow", "r", "s", events=False)
    if raised is CursorExpired:
        assert (caught.value.requested, caught.value.earliest, caught.value.latest) == (2, 5, 9)


def test_follow_refusals_raise_at_once(kind: str) -> None:
    drive = Driver(kind, lambda _: problem("cursor-ahead-of-head", cursor=5, head=0))
    with pytest.raises(client_lib.CursorAheadOfHead):
        drive("follow", "r", "s", cursor=5)
    assert len(drive.requests) == 1
    drive = Driver(kind, lambda _: httpx.Response(200, json={}))
    with pytest.raises(client_lib.UnexpectedAnswer):
        drive("follow", "r", "s")


def test_follow_gives_up_before_ever_connecting_after_the_policy_total(kind: str) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    policy = RetryPolicy(total_seconds=0.05, base_delay=0.01, max_delay=0.01)
    with pytest.raises(StreamsConnectionError):
        Driver(kind, refuse, policy)("follow", "r", "s")


def test_sync_follow_is_a_plain_generator() -> None:
    with SyncStreamsClient(
        BASE, "t", transport=httpx.MockTransport(lambda _: sse(record_event(1, 1)))
    ) as c:
        items = c.follow("r", "s")
        assert isinstance(items, Iterator)
        with contextlib.closing(items):
            assert next(items).sequence == 1  # type: ignore[union-attr]


def test_the_package_is_marked_typed_and_packaged_so() -> None:
    import tomllib
    from pathlib import Path

    package = Path(client_lib.__file__).parent
    assert (package / "py.typed").is_file()
    config = tomllib.loads((package.parents[1] / "pyproject.toml").read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["*"]


# -- what a stranger's program meets ---------------------------------------------------------------


@pytest.mark.parametrize(
    "method", ["follow", "iter_runs", "iter_streams", "iter_tokens", "get_object_body"]
)
def test_the_streaming_methods_are_typed_as_closable_generators(method: str) -> None:
    # docs/client.md wraps follow() in contextlib.aclosing (closing, for the sync client): a
    # return type of AsyncIterator / Iterator has no aclose / close, so mypy refuses that.
    from collections.abc import AsyncGenerator, Generator

    asynchronous = typing.get_type_hints(getattr(StreamsClient, method))["return"]
    assert typing.get_origin(asynchronous) is AsyncGenerator
    blocking = typing.get_type_hints(getattr(SyncStreamsClient, method))["return"]
    assert typing.get_origin(blocking) is Generator


def garbled(content_type: str = "application/json", status: int = 200) -> Handler:
    """A proxy that says gzip and sends something else."""
    headers = {"content-type": content_type, "content-encoding": "gzip"}
    # A stream, not content=: httpx decodes content= at once, a real answer as it is read.
    return lambda _: httpx.Response(
        status, headers=headers, stream=httpx.ByteStream(b"not gzip at all")
    )


@pytest.mark.parametrize(
    ("method", "args", "content_type", "status"),
    [
        ("get_stream", ("r", "s"), "application/json", 200),
        ("get_stream", ("r", "s"), "application/problem+json", 404),
        ("get_object_body", ("r", "s", "o"), "application/octet-stream", 200),
        ("follow", ("r", "s"), "text/event-stream", 200),
    ],
)
def test_a_body_that_cannot_be_decoded_is_an_unexpected_answer(
    kind: str, method: str, args: tuple[str, ...], content_type: str, status: int
) -> None:
    drive = Driver(kind, garbled(content_type, status))
    with pytest.raises(client_lib.UnexpectedAnswer) as caught:
        drive(method, *args)
    assert caught.value.status == status
    assert "decod" in caught.value.detail
    assert len(drive.requests) == 1  # nothing transient about it: not retried


@pytest.mark.parametrize(
    "event",
    [
        "event: record\ndata: {not json\n\n",
        'event: record\ndata: {"sequence": "one"}\n\n',
        "event: closed\ndata: {}\n\n",
        'event: gone\ndata: {"requested": 1}\n\n',
    ],
)
def test_a_follow_event_of_the_wrong_shape_is_an_unexpected_answer(kind: str, event: str) -> None:
    drive = Driver(kind, lambda _: sse(record_event(1, "a"), event))
    with pytest.raises(client_lib.UnexpectedAnswer) as caught:
        drive("follow", "r", "s")
    assert caught.value.code == "unexpected-answer" and "subscribe" in caught.value.detail


def test_an_html_error_page_of_a_proxy_is_named_for_what_it_is(kind: str) -> None:
    page = "<html><head><title>502 Bad Gateway</title></head><body><h1>502</h1>nginx</body></html>"
    gateway = httpx.Response(502, text=page, headers={"content-type": "text/html"})
    drive = Driver(kind, lambda _: gateway, RetryPolicy.none())
    with pytest.raises(StreamsError) as caught:
        drive("get_stream", "r", "s")
    error = caught.value
    assert type(error) is StreamsError and (error.status, error.code) == (502, "http-502")
    assert "<" not in str(error) and "Bad Gateway" in str(error)
    assert "HTML page" in error.detail
    assert error.problem["text"] == page  # kept, for whoever debugs the proxy


@pytest.mark.parametrize(
    "url", ["http://[::1", "http://127.0.0.1:99999", "http://127.0.0.1:0", "ftp://h", "h:80"]
)
def test_a_base_url_that_no_call_could_use_is_a_value_error(kind: str, url: str) -> None:
    # `http://[::1` raised httpx.InvalidURL; a port past 65535 was taken, then every call
    # raised OverflowError (in an ExceptionGroup) from the socket.
    with pytest.raises(ValueError, match="base_url must be an http:// or https:// URL"):
        SyncStreamsClient(url) if kind == "sync" else StreamsClient(url)


def test_a_token_read_from_a_file_with_its_newline_is_sent_without_it(kind: str) -> None:
    # `serve` writes .ductor-streams/dev-token with a newline; Path.read_text() keeps it, and
    # the header then failed every call as "cannot reach" a server that was there.
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["authorization"])
        return httpx.Response(200, json={"runs": [], "next_after": None})

    transport = httpx.MockTransport(handler)
    if kind == "sync":
        with SyncStreamsClient(BASE, " tok-1\n", transport=transport) as sync:
            sync.list_runs()
    else:

        async def go() -> None:
            async with StreamsClient(BASE, "tok-1\n", transport=transport) as client:
                await client.list_runs()

        import asyncio

        asyncio.run(go())
    assert seen == ["Bearer tok-1"]
    with pytest.raises(ValueError, match="token"):
        SyncStreamsClient(BASE, "tok\nen") if kind == "sync" else StreamsClient(BASE, "tok\x00")


@pytest.mark.parametrize("key", ["line\nbreak", "clé", "k" * 256, " ", "k ", " k"])
def test_an_idempotency_key_no_header_can_carry_is_refused_before_sending(
    kind: str, key: str
) -> None:
    # A newline (or a space at either end) made an illegal header, reported as "cannot reach"
    # the server; a non-ASCII key raised UnicodeEncodeError from inside httpx.
    drive = Driver(kind, lambda _: httpx.Response(201, json=APPENDED))
    with pytest.raises(ValueError, match="idempotency_key"):
        drive("append", "r", "s", [1], idempotency_key=key)
    assert drive.requests == []
    assert drive("append", "r", "s", [1], idempotency_key="k" * 255).head == 1
    assert drive("append", "r", "s", [1], idempotency_key="a key").head == 1


class Point(msgspec.Struct):
    x: float


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), -float("inf"), {"a": [1, {"b": float("nan")}]}, Point(x=1e400)],
)
def test_a_float_that_is_not_finite_is_refused_before_sending_never_sent_as_null(
    kind: str, value: Any
) -> None:
    # msgspec writes nan and infinity as null: append([nan]) succeeded and stored null.
    drive = Driver(kind, lambda _: httpx.Response(201, json=APPENDED))
    with pytest.raises(ValueError, match="not a JSON number"):
        drive("append", "r", "s", [1, value])
    with pytest.raises(ValueError, match="not a JSON number"):
        drive("create_stream", "r", "s", schema={"maximum": value})
    assert drive.requests == []
    # null itself, and the text of one, still go as they are
    drive("append", "r", "s", [None, {"a": None}, "null", 1e308, Point(x=-0.0)])
    sent = json.loads(drive.requests[0].content)["records"]
    assert [r["data"] for r in sent] == [None, {"a": None}, "null", 1e308, {"x": -0.0}]
    # JSON text given as it is (msgspec.Raw) holds no float of ours: sent as it is.
    drive("append", "r", "s", [msgspec.Raw(b"[1,null]"), {"a": msgspec.Raw(b"null")}])
    sent = json.loads(drive.requests[1].content)["records"]
    assert [r["data"] for r in sent] == [[1, None], {"a": None}]


# -- path parts ------------------------------------------------------------------------------------

# Every ID a client method puts in its path; a sample of every other required parameter.
PATH_IDS = {"run_id", "stream_id", "consumer_id", "object_id", "token_id", "subscription_id"}
SAMPLES: dict[str, Any] = {
    "records": [1],
    "sequence": 1,
    "enabled": True,
    "source": b"x",
    "token": "t",
    "wake_id": "w",
    "generation": 1,
    "worker": "w1",
    "streams": [("r", "s")],
    "type": "pull-wake",
    "scopes": ["streams:read"],
    "expires_in_seconds": 60,
}


def path_methods(cls: type) -> list[tuple[str, list[inspect.Parameter]]]:
    """The public methods of `cls` with an ID in their path: name and required parameters."""
    found = []
    for name in sorted(dir(cls)):
        if name.startswith("_") or not callable(getattr(cls, name)):
            continue
        parameters = inspect.signature(getattr(cls, name)).parameters.values()
        required = [p for p in parameters if p.default is p.empty and p.name != "self"]
        if PATH_IDS & {p.name for p in required}:
            found.append((name, required))
    return found


def test_the_path_table_knows_every_method_with_an_id_in_its_path() -> None:
    methods = dict(path_methods(StreamsClient))
    assert {"delete_stream", "delete_consumer", "get_stream", "follow", "producer"} <= set(methods)
    assert dict(path_methods(SyncStreamsClient)).keys() == methods.keys() - {"close"}
    for required in methods.values():
        assert {p.name for p in required} <= PATH_IDS | SAMPLES.keys(), required


@pytest.mark.parametrize("bad", ["", ".", ".."])
def test_an_id_no_path_can_carry_is_invalid_input_and_nothing_is_sent(kind: str, bad: str) -> None:
    # httpx removes dot segments: delete_stream("r1", "..") sent DELETE .../runs/r1 and deleted
    # the whole run, delete_consumer(..., "..") the stream, get_stream("r1", ".") listed the run.
    drive = Driver(kind, lambda _: httpx.Response(204))
    cls = SyncStreamsClient if kind == "sync" else StreamsClient
    for method, required in path_methods(cls):
        for named in PATH_IDS & {p.name for p in required}:
            values = {p.name: SAMPLES.get(p.name, "ok") for p in required} | {named: bad}
            args = [values[p.name] for p in required if p.kind != p.KEYWORD_ONLY]
            kwargs = {p.name: values[p.name] for p in required if p.kind == p.KEYWORD_ONLY}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # the async close(run, s)
                with pytest.raises(InvalidInput) as caught:
                    drive(method, *args, **kwargs)
            error = caught.value
            assert (error.status, error.code, error.field) == (0, "invalid-input", named), method
            assert repr(bad) in error.detail
    assert drive.requests == []


def test_dots_inside_an_id_are_sent_as_they_are(kind: str) -> None:
    drive = Driver(kind, lambda _: httpx.Response(204))
    drive("delete_consumer", "r.1", "s..x", "c...")
    drive("delete_stream", "r1", "a/..")  # a slash is encoded: one part, refused by the service
    assert [r.url.raw_path for r in drive.requests] == [
        b"/api/workflow-streams/runs/r.1/streams/s..x/consumers/c...",
        b"/api/workflow-streams/runs/r1/streams/a%2F..",
    ]
