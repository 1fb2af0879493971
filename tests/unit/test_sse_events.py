"""The SSE wire format of each delivery."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime
from types import SimpleNamespace

from application.live import Idle, Overtaken, RecordsDelivered, StreamEnded
from application.ports import StoredRecord
from domain.records import RecordKind
from entrypoints.edge.writing import WRITE_BYTES
from entrypoints.sse import asgi as sse_asgi
from entrypoints.sse.asgi import EventStreamResponse
from entrypoints.sse.events import event_stream

AT = datetime(2026, 1, 1, tzinfo=UTC)


def stored(sequence: int, payload: bytes = b'{"a":1}') -> StoredRecord:
    return StoredRecord(sequence, AT, RecordKind.JSON, "application/json", len(payload), payload)


async def frames(*deliveries) -> list[bytes]:
    async def source():
        for d in deliveries:
            yield d

    return [chunk async for chunk in event_stream(source())]


async def test_records_then_closed_end_the_stream() -> None:
    out = b"".join(
        await frames(RecordsDelivered([stored(1), stored(2)]), Idle(), StreamEnded(head=2))
    )
    events = [e for e in out.decode().split("\n\n") if e]
    assert events[0] == ": subscribed"
    assert events[1].startswith("id: 1\nevent: record\ndata: ")
    assert json.loads(events[1].split("data: ", 1)[1]) == {
        "sequence": 1,
        "appended_at": "2026-01-01T00:00:00Z",
        "size": 7,
        "content_type": "application/json",
        "data": {"a": 1},
    }
    assert events[2].startswith("id: 2\n")
    assert events[3] == ": keep-alive"
    assert events[4] == 'event: closed\ndata: {"head":2}'


async def test_gone_carries_the_410_fields() -> None:
    out = b"".join(await frames(Overtaken(requested=4, earliest=9, latest=12)))
    event = out.decode().split("\n\n")[1]
    assert event.startswith("event: gone\ndata: ")
    assert json.loads(event.split("data: ", 1)[1]) == {
        "requested": 4,
        "earliest": 9,
        "latest": 12,
        "reason": "retention",
    }


async def test_a_large_frame_is_written_in_pieces_the_server_can_hold_back() -> None:
    """A server stops a response's sends after a few waiting messages, whatever their size: a
    frame is handed over in pieces of at most WRITE_BYTES, so a subscriber that stops reading
    holds a few of those, not a few whole frames."""
    frame = bytes(range(256)) * 1_000  # 256,000 bytes
    sent: list[bytes] = []

    async def chunks():
        yield b": subscribed\n\n"
        yield frame

    async def send(message) -> None:
        if message["type"] == "http.response.body":
            sent.append(message["body"])

    await EventStreamResponse(chunks(), [])._write(send)
    assert max(len(piece) for piece in sent) <= WRITE_BYTES
    assert b"".join(sent) == b": subscribed\n\n" + frame


class _Stalled:
    """A client that takes the response's head and then nothing."""

    def __init__(self) -> None:
        self.bodies = 0

    async def send(self, message) -> None:
        if message["type"] == "http.response.body":
            self.bodies += 1
            await asyncio.Event().wait()

    async def receive(self):
        await asyncio.Event().wait()


async def _endless():
    while True:
        yield b": keep-alive\n\n"
        await asyncio.sleep(0.01)


async def test_a_client_that_takes_nothing_ends_its_event_stream(monkeypatch, caplog) -> None:
    monkeypatch.setattr(sse_asgi, "WRITE_STALL_SECONDS", 0.1)
    caplog.set_level(logging.INFO, "ductor_streams.sse")
    client = _Stalled()
    scope = {"type": "http", "app": SimpleNamespace(state=SimpleNamespace())}
    async with asyncio.timeout(5):
        await EventStreamResponse(_endless(), [])(scope, client.receive, client.send)
    assert client.bodies == 1
    assert "its client took nothing" in caplog.text


class _Slow:
    """A client that takes one piece every `pause` seconds: never stalled for a whole
    WRITE_STALL_SECONDS."""

    def __init__(self, pause: float) -> None:
        self.pause = pause
        self.taken = 0

    async def send(self, message) -> None:
        if message["type"] == "http.response.body":
            await asyncio.sleep(self.pause)
            self.taken += len(message["body"])

    async def receive(self):
        await asyncio.Event().wait()


async def test_a_client_that_reads_too_slowly_ends_its_event_stream(monkeypatch, caplog) -> None:
    """A 1 MB chunk must be taken within the stall bound plus its size at the minimum rate;
    a client taking a 64 KiB piece every 0.05 s (under the 0.2 s stall bound; 1.3 MB/s) is
    ended once the chunk's bound (0.2 + 1 MB at 4 MB/s: 0.45 s) passes, part way through."""
    monkeypatch.setattr(sse_asgi, "WRITE_STALL_SECONDS", 0.2)
    monkeypatch.setattr(sse_asgi, "WRITE_MIN_BYTES_PER_SECOND", 4_000_000)
    caplog.set_level(logging.INFO, "ductor_streams.sse")
    client = _Slow(0.05)

    async def one_big_chunk():
        yield b"x" * 1_000_000

    scope = {"type": "http", "app": SimpleNamespace(state=SimpleNamespace())}
    async with asyncio.timeout(5):
        await EventStreamResponse(one_big_chunk(), [])(scope, client.receive, client.send)
    assert 0 < client.taken < 1_000_000
    assert "read slower than" in caplog.text


async def test_stopping_ends_the_event_streams_still_writing() -> None:
    state = SimpleNamespace()
    client = _Stalled()
    scope = {"type": "http", "app": SimpleNamespace(state=state)}
    serving = asyncio.create_task(
        EventStreamResponse(_endless(), [])(scope, client.receive, client.send)
    )
    await asyncio.sleep(0.05)
    assert not serving.done()
    sse_asgi.stop_all(state, grace_seconds=0.05)
    async with asyncio.timeout(5):
        await serving
