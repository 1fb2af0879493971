"""Deliveries as `text/event-stream` bytes. Only this module knows the wire format; another live
transport would consume the same application subscription."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator

import msgspec

from application.live import Delivery, Idle, Overtaken, RecordsDelivered, StreamEnded
from application.views import record_view

_encode = msgspec.json.Encoder().encode

OPENING = b": subscribed\n\n"
HEARTBEAT = b": keep-alive\n\n"


async def event_stream(deliveries: AsyncIterable[Delivery]) -> AsyncIterator[bytes]:
    yield OPENING
    async for delivery in deliveries:
        match delivery:
            case RecordsDelivered(records=records):
                yield b"".join(
                    b"id: %d\nevent: record\ndata: %s\n\n" % (r.sequence, _encode(record_view(r)))
                    for r in records
                )
            case Idle():
                yield HEARTBEAT
            case StreamEnded(head=head):
                yield b'event: closed\ndata: {"head":%d}\n\n' % head
                return
            case Overtaken():
                yield b"event: gone\ndata: %s\n\n" % _encode(delivery)
                return
