"""Deliveries as `text/event-stream` bytes. Only this module knows the wire format; another live
transport would consume the same application subscription."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

import msgspec

from application.live import (
    Delivery,
    Idle,
    Overtaken,
    RecordsDelivered,
    Revoked,
    StreamEnded,
    StreamGone,
)
from application.ports import StoredRecord
from application.views import RecordsEncoder

_encode = msgspec.json.Encoder().encode

OPENING = b": subscribed\n\n"
HEARTBEAT = b": keep-alive\n\n"
DELETED = b"event: deleted\ndata: {}\n\n"
REVOKED = b"event: revoked\ndata: {}\n\n"
# Each record's event written by one bytes template (its RecordView's JSON as the data), not a
# view and an encoding per record (docs/architecture.md "Catch-up reads").
_record_events = RecordsEncoder(b"id: %d\nevent: record\ndata: ", b"\n\n", with_sequence=True)


def records_frame(records: list[StoredRecord]) -> bytes:
    return b"".join(_record_events(records))


async def event_stream(
    deliveries: AsyncGenerator[Delivery, None],
) -> AsyncGenerator[bytes, None]:
    """Closing this stream (the response ended, or the client left) closes the subscription,
    which gives its slot back and leaves the stream's tail at once, not when collected."""
    async with contextlib.aclosing(deliveries):
        yield OPENING
        async for delivery in deliveries:
            match delivery:
                case RecordsDelivered():
                    # One delivery is shared by the subscribers at the same position: its
                    # bytes are encoded once for all of them.
                    yield delivery.encoded_as(records_frame)
                case Idle():
                    yield HEARTBEAT
                case StreamEnded(head=head):
                    yield b'event: closed\ndata: {"head":%d}\n\n' % head
                    return
                case Overtaken():
                    yield b"event: gone\ndata: %s\n\n" % _encode(delivery)
                    return
                case StreamGone():
                    yield DELETED
                    return
                case Revoked():  # the token was revoked or expired: a reconnect gets 401
                    yield REVOKED
                    return
