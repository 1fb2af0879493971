"""Both clients (`StreamsClient` and `SyncStreamsClient`) end to end against real server
processes on real PostgreSQL: typed answers of every method, the lifecycle routes, follow's
final events, a call in flight across a server restart, and a 429 storm through the producers.

Every wait is bounded, so a client bug fails a test instead of hanging it."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from ductor_streams_client import (
    AckAnswer,
    AppendAnswer,
    Closed,
    CommitAnswer,
    ConsumersPage,
    Deleted,
    Expiry,
    LegalHold,
    LegalHoldActive,
    Limits,
    NotFound,
    ObjectIntent,
    Record,
    RecordsPage,
    Retention,
    RetryPolicy,
    RunsPage,
    SizeMismatch,
    StreamClosed,
    StreamDocument,
    StreamList,
    StreamsClient,
    SyncStreamsClient,
)
from tests.conftest import BOOTSTRAP_TOKEN, SERVER_ENV
from tests.support.server import ServerProcess

QUICK = RetryPolicy(attempts=100, base_delay=0.05, max_delay=0.5, total_seconds=30)


class Counting(httpx.HTTPTransport):
    """A real sync transport that counts answers by status."""

    def __init__(self) -> None:
        super().__init__()
        self.statuses: list[int] = []
        self.lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        with self.lock:
            self.statuses.append(response.status_code)
        return response


class AsyncCounting(httpx.AsyncHTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.statuses: list[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        self.statuses.append(response.status_code)
        return response


@pytest.fixture
def sync_client(server: ServerProcess) -> Iterator[SyncStreamsClient]:
    with SyncStreamsClient(server.base_url, BOOTSTRAP_TOKEN, timeout=10, retry=QUICK) as client:
        yield client


def test_every_method_of_the_sync_client_answers_typed(
    sync_client: SyncStreamsClient, run_id: str, tmp_path: Path
) -> None:
    client = sync_client
    until = datetime.now(UTC) + timedelta(days=1)
    document = client.create_stream(
        run_id,
        "s",
        content_class="model_output",
        schema={"type": "object"},
        limits=Limits(max_unread_items=500, unread_policy="block", block_timeout_seconds=0.5),
        retention=Retention(max_records=1000),
        expiry=Expiry(expires_at=until),
    )
    assert isinstance(document, StreamDocument)
    assert (document.content_class, document.schema) == ("model_output", {"type": "object"})
    assert document.limits.unread_policy == "block" and document.limits.block_timeout_seconds == 0.5
    assert document.retention.max_records == 1000
    assert document.expiry.expires_at is not None
    assert abs((document.expiry.expires_at - until).total_seconds()) < 0.001
    assert (
        client.create_stream(
            run_id,
            "s",
            content_class="model_output",
            schema={"type": "object"},
            limits=document.limits,
            retention=document.retention,
            expiry=document.expiry,
        )
        == document
    )  # identical again: the same document
    made_up = client.create_stream(run_id)
    assert made_up.stream_id.startswith("s-")
    assert isinstance(client.get_stream(run_id, "s"), StreamDocument)
    listed = client.list_streams(run_id)
    assert isinstance(listed, StreamList)
    assert sorted(d.stream_id for d in listed.streams) == sorted(["s", made_up.stream_id])
    one = client.list_streams(run_id, limit=1)
    assert len(one.streams) == 1 and one.next_after == one.streams[0].stream_id
    rest = client.list_streams(run_id, after=one.next_after, limit=1)
    assert len(rest.streams) == 1 and rest.next_after is None
    paged = [d.stream_id for d in client.iter_streams(run_id, page_size=1)]
    assert paged == sorted(["s", made_up.stream_id])

    answer = client.append(run_id, "s", [{"n": 1}, b"\x00raw", None])
    assert isinstance(answer, AppendAnswer) and (answer.first_sequence, answer.head) == (1, 3)
    page = client.read(run_id, "s", cursor=0, limit=2)
    assert isinstance(page, RecordsPage) and page.next_cursor == 2
    assert [r.kind for r in page.records] == ["json", "bytes"]
    assert page.records[0].data == {"n": 1} and page.records[1].bytes == b"\x00raw"
    assert client.read(run_id, "s", cursor=2).records[0].data is None
    acked = client.ack(run_id, "s", "ui", 3)
    assert isinstance(acked, AckAnswer) and acked.credit.unread_items == 0
    client.ack(run_id, "s", "audit", 1)
    consumers = client.list_consumers(run_id, "s", limit=1)
    assert isinstance(consumers, ConsumersPage) and consumers.next_after == "audit"
    assert [c.consumer_id for c in client.iter_consumers(run_id, "s", page_size=1)] == [
        "audit",
        "ui",
    ]
    client.delete_consumer(run_id, "s", "audit")
    with pytest.raises(NotFound):
        client.delete_consumer(run_id, "s", "audit")
    assert client.get_stream(run_id, "s").state.consumer_count == 1

    file = tmp_path / "body.bin"
    file.write_bytes(b"0123456789" * 50_000)
    committed = client.put_object(run_id, "s", str(file), content_type="text/plain")
    assert isinstance(committed, CommitAnswer) and committed.sequence == 4
    meta = client.get_object(run_id, "s", committed.object_id)
    assert isinstance(meta, ObjectIntent) and meta.state == "committed" and meta.expires_at is None
    body = b"".join(client.get_object_body(run_id, "s", committed.object_id, chunk_size=65536))
    assert (
        hashlib.sha256(body).hexdigest()
        == meta.sha256
        == hashlib.sha256(file.read_bytes()).hexdigest()
    )
    from_chunks = client.put_object(
        run_id, "s", iter([b"ab", b"c"]), size=3, sha256=hashlib.sha256(b"abc").hexdigest()
    )
    assert from_chunks.sequence == 5

    # an intent prepared but never uploaded, aborted
    prepared = httpx.post(
        f"{client.base_url}/api/workflow-streams/runs/{run_id}/streams/s/objects",
        json={"idempotency_key": "k", "size": 1, "sha256": "0" * 64},
        headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"},
    ).json()
    aborted = client.abort_object(run_id, "s", prepared["object_id"])
    assert isinstance(aborted, ObjectIntent) and aborted.state == "aborted"

    hold = client.set_legal_hold(run_id, "s", True, "audit")
    assert isinstance(hold, LegalHold) and (hold.enabled, hold.reason) == (True, "audit")
    with pytest.raises(LegalHoldActive):
        client.delete_stream(run_id, "s")
    with pytest.raises(LegalHoldActive):
        client.delete_run(run_id)
    assert client.set_legal_hold(run_id, "s", False).enabled is False

    closed = client.close_stream(run_id, "s")
    assert closed.state.closed and closed.state.head == 5
    with pytest.raises(StreamClosed):
        client.append(run_id, "s", ["late"])
    items = list(client.follow(run_id, "s", cursor=3))
    assert [type(i) for i in items] == [Record, Record, Closed]
    assert items[0].kind == "object" and items[-1] == Closed(head=5)  # type: ignore[union-attr]

    runs = client.list_runs(prefix=run_id)
    assert isinstance(runs, RunsPage) and [(r.run_id, r.stream_count) for r in runs.runs] == [
        (run_id, 2)
    ]
    assert [r.run_id for r in client.iter_runs(prefix=run_id, page_size=1)] == [run_id]
    client.delete_stream(run_id, made_up.stream_id)
    client.delete_run(run_id)
    with pytest.raises(NotFound):
        client.get_stream(run_id, "s")


def test_sync_follow_sees_the_deletion(sync_client: SyncStreamsClient, run_id: str) -> None:
    sync_client.create_stream(run_id, "s")
    sync_client.append(run_id, "s", ["one"])
    items: list[Any] = []
    follower = threading.Thread(target=lambda: items.extend(sync_client.follow(run_id, "s")))
    follower.start()
    deadline = time.monotonic() + 10
    while not items and time.monotonic() < deadline:
        time.sleep(0.05)
    sync_client.delete_stream(run_id, "s")
    follower.join(20)
    assert not follower.is_alive()
    assert [type(i) for i in items] == [Record, Deleted]


# -- a server restart ------------------------------------------------------------------------------


class Restartable:
    """A server process of the test's own that can be killed and started again on its port."""

    def __init__(self, database_url: str, data_dir: Path) -> None:
        self.processes = [
            ServerProcess(database_url=database_url, data_dir=data_dir, env=SERVER_ENV).start()
        ]
        self.threads: list[threading.Thread] = []

    @property
    def base_url(self) -> str:
        return self.processes[0].base_url

    def restart_later(self, after: float) -> threading.Thread:
        """Kill the server now, and start it again on the same port `after` seconds later."""
        first = self.processes[0]
        first.kill()
        again = ServerProcess(
            database_url=first.database_url,
            data_dir=first.data_dir,
            env=SERVER_ENV,
            port=first.port,
        )
        self.processes.append(again)

        def start() -> None:
            time.sleep(after)
            again.start()

        thread = threading.Thread(target=start)
        self.threads.append(thread)
        thread.start()
        return thread

    def stop(self) -> None:
        for thread in self.threads:
            thread.join(60)
        for process in self.processes:
            process.stop()


@pytest.fixture
def restartable(
    database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Restartable]:
    server = Restartable(database_url, tmp_path_factory.mktemp("client-both-restart"))
    yield server
    server.stop()


def test_a_sync_call_in_flight_survives_a_server_restart(
    restartable: Restartable, run_id: str
) -> None:
    with SyncStreamsClient(restartable.base_url, BOOTSTRAP_TOKEN, retry=QUICK) as client:
        client.create_stream(run_id, "s")
        restarter = restartable.restart_later(after=1.0)
        answer = client.append(run_id, "s", ["through the restart"])  # sent while it is down
        restarter.join(30)
        assert answer.first_sequence == 1
        assert [r.data for r in client.read(run_id, "s").records] == ["through the restart"]


async def test_an_async_call_in_flight_survives_a_server_restart(
    restartable: Restartable, run_id: str
) -> None:
    async with StreamsClient(restartable.base_url, BOOTSTRAP_TOKEN, retry=QUICK) as client:
        await client.create_stream(run_id, "s")
        await client.append(run_id, "s", ["before"])
        restarter = await asyncio.to_thread(restartable.restart_later, 1.0)
        async with asyncio.timeout(30):
            answer, document = await asyncio.gather(
                client.append(run_id, "s", ["during"]), client.get_stream(run_id, "s")
            )
        await asyncio.to_thread(restarter.join, 30)
        assert answer.first_sequence == 2 and document.stream_id == "s"
        page = await client.read(run_id, "s")
        assert [r.data for r in page.records] == ["before", "during"]


# -- a 429 storm -----------------------------------------------------------------------------------


async def ack_along(client: StreamsClient, run_id: str, count: int) -> list[Any]:
    """Follow the stream and acknowledge every record as it arrives, until `count`."""
    received: list[Any] = []
    items = client.follow(run_id, "s")
    async with contextlib.aclosing(items):
        async for item in items:
            assert isinstance(item, Record)
            received.append(item.data)
            await asyncio.sleep(0.02)  # a slow reader: the writer outruns it
            await client.ack(run_id, "s", "reader", item.sequence)
            if len(received) == count:
                return received
    return received


async def test_the_async_producer_gets_everything_in_through_a_429_storm(
    server: ServerProcess, run_id: str
) -> None:
    transport = AsyncCounting()
    async with StreamsClient(
        server.base_url, BOOTSTRAP_TOKEN, retry=QUICK, transport=transport
    ) as client:
        await client.create_stream(run_id, "s", limits=Limits(max_unread_items=8))
        reader = asyncio.create_task(ack_along(client, run_id, 40))
        async with asyncio.timeout(120):
            async with client.producer(run_id, "s", max_batch_records=4) as producer:
                for n in range(40):
                    await producer.send({"n": n})
            received = await reader
        assert producer.appended == 40
    assert transport.statuses.count(429) >= 3, "no storm: the test would prove nothing"
    assert [d["n"] for d in received] == list(range(40))
    async with StreamsClient(server.base_url, BOOTSTRAP_TOKEN) as client:
        stored = await client.read(run_id, "s", limit=1000)
    assert [r.data["n"] for r in stored.records] == list(range(40))  # in order, no duplicate


def test_the_sync_producer_gets_everything_in_through_a_429_storm(
    server: ServerProcess, run_id: str
) -> None:
    transport = Counting()
    with SyncStreamsClient(
        server.base_url, BOOTSTRAP_TOKEN, retry=RetryPolicy(attempts=2), transport=transport
    ) as client:
        client.create_stream(run_id, "s", limits=Limits(max_unread_items=5))
        stop = threading.Event()

        def ack_everything() -> None:
            while not stop.is_set():
                head = client.get_stream(run_id, "s").state.head
                if head:
                    client.ack(run_id, "s", "reader", head)
                time.sleep(0.3)

        acker = threading.Thread(target=ack_everything)
        acker.start()
        try:
            with client.producer(run_id, "s", max_batch_records=5, linger=0) as producer:
                for n in range(40):
                    producer.send(n)
        finally:
            stop.set()
            acker.join(10)
        stored = client.read(run_id, "s", limit=1000)
    assert transport.statuses.count(429) >= 3, "no storm: the test would prove nothing"
    assert [r.data for r in stored.records] == list(range(40))


@pytest.mark.parametrize("chunks", [[b"abc", b"def"], [b"ab"]], ids=["too-many", "too-few"])
def test_chunks_that_do_not_add_up_to_their_size_raise_size_mismatch(
    server: ServerProcess, run_id: str, chunks: list[bytes]
) -> None:
    # The declared size is the Content-Length: chunks past it or short of it made the HTTP
    # layer (h11) raise its own LocalProtocolError, no StreamsError at all.
    digest = hashlib.sha256(b"".join(chunks)).hexdigest()
    with SyncStreamsClient(server.base_url, BOOTSTRAP_TOKEN, retry=QUICK) as client:
        client.create_stream(run_id, "s")
        with pytest.raises(SizeMismatch) as caught:
            client.put_object(run_id, "s", iter(chunks), size=4, sha256=digest)
        assert "4" in caught.value.detail
        (open_object,) = client.get_stream(run_id, "s").state.open_objects
        assert open_object.state == "prepared"  # nothing landed: abort it, or try again

    async def chunked() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    async def go() -> None:
        async with StreamsClient(server.base_url, BOOTSTRAP_TOKEN, retry=QUICK) as client:
            with pytest.raises(SizeMismatch):
                await client.put_object(run_id, "s", chunked(), size=4, sha256=digest)

    asyncio.run(go())
