"""The producers (async and sync) over a mock transport: batching, order, idempotency keys,
backpressure (429 from the service, and a full buffer holding `send` back), errors surfaced."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import warnings
from typing import Any

import httpx
import pytest

from ductor_streams_client import (
    Producer,
    ProducerClosed,
    RetryPolicy,
    StreamClosed,
    StreamsClient,
    SyncProducer,
    SyncStreamsClient,
)
from ductor_streams_client._core import Batcher, encode_record

BASE = "http://streams.test"
CREDIT = {"unread_items": 0, "unread_bytes": 0, "max_unread_items": 9, "max_unread_bytes": 9}


class Service:
    """A mock append route: records what it stored, once per idempotency key."""

    def __init__(self, *, refuse_first: int = 0, fail_with: str | None = None) -> None:
        self.requests: list[tuple[str, list[Any]]] = []
        self.stored: list[Any] = []
        self.answers: dict[str, dict[str, Any]] = {}
        self.refuse_first = refuse_first  # answer this many requests 429 first
        self.fail_with = fail_with
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        key = request.headers["idempotency-key"]
        records = [
            r.get("data", r.get("data_base64")) for r in json.loads(request.content)["records"]
        ]
        with self.lock:
            self.requests.append((key, records))
            if self.fail_with:
                return httpx.Response(409, json={"code": self.fail_with, "detail": "no"})
            if self.refuse_first > 0:
                self.refuse_first -= 1
                return httpx.Response(
                    429,
                    json={"code": "backpressure", "detail": "full"},
                    headers={"Retry-After": "0"},
                )
            if key in self.answers:
                return httpx.Response(200, json=self.answers[key])
            first = len(self.stored) + 1
            self.stored.extend(records)
            answer = {
                "first_sequence": first,
                "last_sequence": len(self.stored),
                "head": len(self.stored),
                "credit": CREDIT,
            }
            self.answers[key] = answer
            return httpx.Response(201, json=answer)


def async_client(handler: Any, policy: RetryPolicy | None = None) -> StreamsClient:
    return StreamsClient(BASE, "t", retry=policy, transport=httpx.MockTransport(handler))


def sync_client(handler: Any, policy: RetryPolicy | None = None) -> SyncStreamsClient:
    return SyncStreamsClient(BASE, "t", retry=policy, transport=httpx.MockTransport(handler))


# -- the batching rules ---------------------------------------------------------------------------


def test_the_batcher_cuts_batches_at_either_ceiling_in_order() -> None:
    batcher = Batcher(max_batch_records=3, max_batch_bytes=40, linger=1.0)
    parts = [encode_record(n) for n in range(10)]  # b'{"data":0}': 10 bytes (+1 comma)
    for part in parts:
        batcher.add(part, now=0.0)
    assert batcher.wait(now=0.5, flushing=False) == 0.0  # full: due now
    batches = [batcher.take(now=0.5) for _ in range(4)]
    assert [b.count for b in batches] == [3, 3, 3, 1]
    assert [p for b in batches for p in b.parts] == parts
    assert len({b.key for b in batches}) == 4  # a key of its own each

    small = Batcher(max_batch_records=100, max_batch_bytes=25, linger=1.0)
    for part in parts[:5]:
        small.add(part, now=0.0)
    assert small.take(now=0.0).count == 2  # 2 x 11 bytes fit in 25, a third does not


def test_the_batcher_lingers_then_is_due() -> None:
    batcher = Batcher(max_batch_records=10, linger=0.2)
    assert batcher.wait(now=0.0, flushing=False) is None
    assert batcher.add(b"{}", now=1.0) is True  # the first record wakes the flusher
    assert batcher.add(b"{}", now=1.1) is False
    assert batcher.wait(now=1.1, flushing=False) == pytest.approx(0.1)
    assert batcher.wait(now=1.1, flushing=True) == 0.0
    assert batcher.wait(now=1.3, flushing=False) == 0.0


def test_the_buffer_bound() -> None:
    batcher = Batcher(max_batch_records=2, max_buffered_records=3)
    for _ in range(3):
        assert batcher.room(2)
        batcher.add(b"{}", now=0.0)
    assert not batcher.room(2)
    batcher.take(now=0.0)
    assert batcher.room(2)
    with pytest.raises(ValueError):
        Batcher(max_batch_records=1001)
    with pytest.raises(ValueError):
        Batcher(max_batch_bytes=1).add(b"{}", now=0.0)


# -- the async producer ----------------------------------------------------------------------------


async def test_one_request_per_batch_in_order_each_with_its_key() -> None:
    service = Service()
    async with async_client(service) as client:
        async with client.producer("r", "s", max_batch_records=50, linger=0.05) as producer:
            for n in range(500):
                await producer.send({"n": n})
        assert producer.appended == 500 and producer.unsent == 0
    assert [r["n"] for r in service.stored] == list(range(500))
    assert 10 <= len(service.requests) < 500
    assert all(len(records) <= 50 for _, records in service.requests)
    assert len({key for key, _ in service.requests}) == len(service.requests)
    assert producer.last_answer is not None and producer.last_answer.head == 500


async def test_a_sender_that_never_yields_still_hands_over_each_full_batch() -> None:
    """A tight loop of sends (nothing else awaited) gives the flusher each full batch as it
    fills, rather than buffering everything until the loop ends."""
    service = Service()
    async with (
        async_client(service) as client,
        client.producer(
            "r", "s", max_batch_records=10, linger=60, max_buffered_records=1_000
        ) as producer,
    ):
        for n in range(100):
            await producer.send({"n": n})
        assert producer.batches >= 5, producer.batches
    assert [r["n"] for r in service.stored] == list(range(100))


async def test_linger_sends_a_partial_batch_and_flush_waits_for_it() -> None:
    service = Service()
    async with async_client(service) as client:
        producer = client.producer("r", "s", max_batch_records=100, linger=0.01)
        await producer.send("a")
        await producer.send("b")
        await producer.flush()
        assert service.stored == ["a", "b"] and len(service.requests) == 1
        await producer.send("c")
        await producer.close()
        assert service.stored == ["a", "b", "c"]
        with pytest.raises(ProducerClosed):
            await producer.send("d")


async def test_backpressure_is_waited_out_with_the_same_key_and_no_duplicates() -> None:
    service = Service(refuse_first=5)
    client = async_client(service, RetryPolicy(attempts=2, base_delay=0))
    async with client, client.producer("r", "s", max_batch_records=10, linger=0) as producer:
        for n in range(30):
            await producer.send(n)
    assert service.stored == list(range(30))
    keys = [key for key, _ in service.requests]
    first_batch = keys[0]
    assert keys[:6] == [first_batch] * 6  # five 429s, then it went in, on one key
    # One key per batch, whatever the retries: each distinct batch (of at most ten) has its own.
    batches = {key: tuple(records) for key, records in service.requests}
    assert len(set(keys)) == len(batches) >= 3
    assert all(len(records) <= 10 for records in batches.values())


async def test_a_full_buffer_holds_send_back_until_the_service_takes_more() -> None:
    gate = asyncio.Event()
    seen = asyncio.Event()
    stored: list[Any] = []

    async def slow(request: httpx.Request) -> httpx.Response:
        seen.set()
        await gate.wait()
        records = [r["data"] for r in json.loads(request.content)["records"]]
        stored.extend(records)
        answer = {
            "first_sequence": 1,
            "last_sequence": len(stored),
            "head": len(stored),
            "credit": CREDIT,
        }
        return httpx.Response(201, json=answer)

    async with async_client(slow) as client:
        producer = client.producer("r", "s", max_batch_records=5, max_buffered_records=10, linger=0)

        async def send_all() -> None:
            for n in range(40):
                await producer.send(n)

        sender = asyncio.create_task(send_all())
        await seen.wait()  # the first batch (5) is in flight and held
        for _ in range(20):
            await asyncio.sleep(0)
        assert not sender.done()  # held back: 5 in flight + 10 buffered of 40
        assert producer.unsent <= 15
        gate.set()
        await sender
        await producer.close()
    assert stored == list(range(40))


async def test_the_first_error_is_raised_by_flush_send_and_close() -> None:
    service = Service(fail_with="stream-closed")
    async with async_client(service) as client:
        producer = client.producer("r", "s", linger=0)
        await producer.send(1)
        with pytest.raises(StreamClosed):
            await producer.flush()
        with pytest.raises(StreamClosed):
            await producer.send(2)
        with pytest.raises(StreamClosed):
            await producer.close()
        assert producer.unsent == 1 and len(service.requests) == 1


async def test_an_exception_in_the_block_drops_the_buffer_without_raising_more() -> None:
    service = Service()
    async with async_client(service) as client:
        with pytest.raises(KeyError):
            async with client.producer("r", "s", linger=10) as producer:
                await producer.send(1)
                raise KeyError("stop")
    assert service.stored == []


# -- the sync producer -----------------------------------------------------------------------------


def test_sync_producer_batches_in_order_with_keys() -> None:
    service = Service(refuse_first=2)
    with sync_client(service, RetryPolicy(attempts=1)) as client:
        with client.producer("r", "s", max_batch_records=25, linger=0.02) as producer:
            for n in range(200):
                producer.send(n)
        assert producer.appended == 200
    assert service.stored == list(range(200))
    assert len(service.requests) < 200
    assert service.requests[0][0] == service.requests[2][0]  # 429, 429, then in: one key


def test_sync_producer_blocks_on_a_full_buffer() -> None:
    gate = threading.Event()
    service = Service()

    def slow(request: httpx.Request) -> httpx.Response:
        gate.wait(30)
        return service(request)

    with sync_client(slow) as client:
        producer = client.producer("r", "s", max_batch_records=5, max_buffered_records=5, linger=0)
        sent = []

        def send_all() -> None:
            for n in range(30):
                producer.send(n)
                sent.append(n)

        sender = threading.Thread(target=send_all)
        sender.start()
        sender.join(0.3)
        assert sender.is_alive() and len(sent) < 30  # blocked in send
        gate.set()
        sender.join(30)
        producer.close()
    assert service.stored == list(range(30))


def test_sync_producer_surfaces_the_first_error() -> None:
    with sync_client(Service(fail_with="stream-closed")) as client:
        producer = client.producer("r", "s", linger=0)
        producer.send("x")
        with pytest.raises(StreamClosed):
            producer.flush()
        with pytest.raises(StreamClosed):
            producer.send("y")
        with pytest.raises(StreamClosed):
            producer.close()


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_leaving_the_block_by_an_exception_does_not_wait_out_backpressure(kind: str) -> None:
    # The stream pushes back (429, Retry-After: 5) and the program fails meanwhile: dropping the
    # buffer must not sit out the wait and send the batch again (up to backpressure_timeout).
    refused = threading.Event()
    requests: list[str] = []

    def full(request: httpx.Request) -> httpx.Response:
        requests.append(request.headers["idempotency-key"])
        refused.set()
        answer = {"code": "backpressure", "detail": "full", "status": 429}
        return httpx.Response(429, json=answer, headers={"Retry-After": "5"})

    patient = {"backpressure_timeout": 6.0}  # a second try would come 5 s on, then give up
    producer: Producer | SyncProducer

    if kind == "sync":
        client = sync_client(full, RetryPolicy.none())
        with pytest.raises(KeyError), client.producer("r", "s", linger=0, **patient) as producer:
            producer.send(1)
            refused.wait()
            raise KeyError("the program failed")
        client.close()
    else:

        async def go() -> Producer:
            async with async_client(full, RetryPolicy.none()) as client:
                with pytest.raises(KeyError):
                    async with client.producer("r", "s", linger=0, **patient) as producer:
                        await producer.send(1)
                        while not refused.is_set():
                            await asyncio.sleep(0.001)
                        raise KeyError("the program failed")
            return producer

        producer = asyncio.run(go())
    assert len(requests) == 1  # returned without trying again
    assert producer.appended == 0 and producer.unsent == 1


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_a_record_over_the_inline_limit_is_refused_by_send_not_by_its_whole_batch(
    kind: str,
) -> None:
    # The service refuses a record over 65,536 bytes (413 record-too-large) and with it the
    # whole append: the other records of the batch, and the producer, would go down with it.
    service = Service()
    big_json = {"text": "x" * 65_536}
    big_bytes = b"x" * 65_537
    fits = b"x" * 65_536  # exactly the limit: its base64 is longer, but it is stored as is
    if kind == "sync":
        with sync_client(service) as client, client.producer("r", "s", linger=10) as producer:
            producer.send(1)
            for value in (big_json, big_bytes):
                with pytest.raises(ValueError, match="inline limit"):
                    producer.send(value)
            producer.send(fits)
            producer.send(2)
    else:

        async def go() -> None:
            client = async_client(service)
            async with client, client.producer("r", "s", linger=10) as producer:
                await producer.send(1)
                for value in (big_json, big_bytes):
                    with pytest.raises(ValueError, match="inline limit"):
                        await producer.send(value)
                await producer.send(fits)
                await producer.send(2)

        asyncio.run(go())
    assert service.stored[0] == 1 and service.stored[2] == 2 and len(service.stored) == 3


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_a_float_that_is_not_finite_is_refused_by_send_not_stored_as_null(kind: str) -> None:
    # msgspec writes nan and infinity as null: the service stored null in their place.
    service = Service()
    refused = [float("nan"), {"x": [float("inf")]}, [1, -float("inf")]]
    if kind == "sync":
        with sync_client(service) as client, client.producer("r", "s", linger=10) as producer:
            for value in refused:
                with pytest.raises(ValueError, match="not a JSON number"):
                    producer.send(value)
            producer.send({"x": None})
    else:

        async def go() -> None:
            client = async_client(service)
            async with client, client.producer("r", "s", linger=10) as producer:
                for value in refused:
                    with pytest.raises(ValueError, match="not a JSON number"):
                        await producer.send(value)
                await producer.send({"x": None})

        asyncio.run(go())
    assert service.stored == [{"x": None}]


# -- a producer nobody closed ------------------------------------------------------------------


EXITING = """
import json, sys
import httpx
from ductor_streams_client import SyncStreamsClient

def handler(request):
    records = [r["data"] for r in json.loads(request.content)["records"]]
    if sys.argv[1] == "refuse":
        return httpx.Response(409, json={"code": "stream-closed", "detail": "closed"})
    print("appended", records, flush=True)
    credit = {"unread_items": 0, "unread_bytes": 0, "max_unread_items": 9, "max_unread_bytes": 9}
    answer = {"first_sequence": 1, "last_sequence": 3, "head": 3, "credit": credit}
    return httpx.Response(201, json=answer)

client = SyncStreamsClient("http://streams.test", "t", transport=httpx.MockTransport(handler))
producer = client.producer("r", "s", linger=3600)
for n in range(3):
    producer.send(n)
print("leaving", flush=True)
"""


def test_the_sync_producer_appends_what_it_buffered_when_the_interpreter_exits() -> None:
    # Its flusher is a daemon thread: without a hook the interpreter would stop it in silence,
    # and what it buffered (a long linger, or a program that never flushed) would be lost.
    done = subprocess.run(
        [sys.executable, "-c", EXITING, "accept"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["leaving", "appended [0, 1, 2]"]
    assert done.stderr == ""


def test_an_error_of_that_last_append_is_printed_not_swallowed() -> None:
    done = subprocess.run(
        [sys.executable, "-c", EXITING, "refuse"], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.splitlines() == ["leaving"]
    assert "StreamClosed" in done.stderr and "409 stream-closed: closed" in done.stderr


def test_an_async_producer_whose_loop_stops_before_it_closed_warns_what_it_drops() -> None:
    service = Service()

    async def forgetful() -> None:
        producer = async_client(service).producer("r", "s", linger=3600)
        await producer.send(1)
        await producer.send(2)

    with pytest.warns(RuntimeWarning, match=r"2 records .*not appended"):
        asyncio.run(forgetful())
    assert service.stored == []


def test_a_closed_async_producer_does_not_warn() -> None:
    service = Service()

    async def tidy() -> None:
        async with async_client(service).producer("r", "s", linger=3600) as producer:
            await producer.send(1)
        async with async_client(service).producer("r", "s", linger=3600) as dropped:
            await dropped.send(2)
            await dropped.aclose_quietly()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        asyncio.run(tidy())
    assert service.stored == [1]
