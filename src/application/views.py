"""What the use cases answer: plain msgspec Structs the entrypoints encode as they are."""

from __future__ import annotations

import base64
import heapq
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from application.ports import StoredRecord
from domain.definition import (
    Authorization,
    Expiry,
    Limits,
    Placement,
    Redaction,
    Retention,
)
from domain.objects import ObjectIntent
from domain.records import RecordKind
from domain.stream import Credit, Stream

# The consumers a stream document shows (the first, by consumer_id); the rest are behind
# GET …/consumers, a keyset page like GET /runs.
DOCUMENT_CONSUMERS = 100


class ConsumerView(msgspec.Struct, frozen=True):
    consumer_id: str
    acked_sequence: int
    holds_credit: bool  # false: it tracks its position and holds nothing back


class LegalHoldView(msgspec.Struct, frozen=True):
    enabled: bool
    reason: str | None
    updated_at: datetime | None


class InputDeliveryStatus(msgspec.Struct, frozen=True):
    delivered_through: int
    pending: int
    last_error: str | None


class OpenObjectView(msgspec.Struct, frozen=True):
    """An object intent not yet committed, aborted or expired."""

    object_id: str
    state: str  # prepared or uploaded
    size: int
    content_type: str
    created_at: datetime
    expires_at: datetime


# The stream document shows at most this many open object intents (the oldest first); the
# counts cover all of them, and `GET …/objects` pages through every one.
DOCUMENT_OPEN_OBJECTS = 20


def open_object_view(intent: ObjectIntent) -> OpenObjectView:
    return OpenObjectView(
        object_id=intent.object_id,
        state=intent.state,
        size=intent.size,
        content_type=intent.content_type,
        created_at=intent.created_at,
        expires_at=intent.expires_at,
    )


def open_intents(stream: Stream) -> list[ObjectIntent]:
    """The stream's open intents in the order the document and `GET …/objects` show them:
    oldest first, then by object ID."""
    return sorted(stream.state.objects.values(), key=lambda i: (i.created_at, i.object_id))


class ObjectList(msgspec.Struct, frozen=True):
    """A page of a stream's open object intents; `next_after` is the last one's object_id, or
    null when no more follow."""

    objects: list[OpenObjectView]
    next_after: str | None


class StreamStateView(msgspec.Struct, frozen=True, omit_defaults=True):
    head: int
    earliest: int
    closed: bool
    closed_at: datetime | None
    legal_hold: LegalHoldView
    total_items: int
    total_bytes: int
    consumer_count: int
    consumers: list[ConsumerView]  # the first DOCUMENT_CONSUMERS by consumer_id
    credit: Credit
    # The first DOCUMENT_OPEN_OBJECTS open intents; the counts are of all of them.
    open_objects: list[OpenObjectView]
    open_objects_count: int
    open_objects_bytes: int  # what the open intents pledge against max_total_bytes
    input_delivery: InputDeliveryStatus | msgspec.UnsetType = msgspec.UNSET


class ForkView(msgspec.Struct, frozen=True):
    """What a fork (made through the Durable Streams surface) inherits: its source's records
    1..`through`, read through the source; its `state` counts only its own, after `through`."""

    run_id: str
    stream_id: str
    source_created_at: datetime
    through: int


class StreamDocument(msgspec.Struct, frozen=True):
    stream_id: str
    run_id: str
    direction: str
    content_class: str
    schema: Any
    limits: Limits
    retention: Retention
    redaction: Redaction
    placement: Placement
    authorization: Authorization
    expiry: Expiry
    created_at: datetime
    state: StreamStateView
    # A stream made through the Durable Streams surface: its media type, and what it forks.
    content_type: str | msgspec.UnsetType = msgspec.UNSET
    fork: ForkView | msgspec.UnsetType = msgspec.UNSET


def stream_document(
    stream: Stream, input_delivery: InputDeliveryStatus | msgspec.UnsetType = msgspec.UNSET
) -> StreamDocument:
    d, s = stream.definition, stream.state
    assert s.created_at is not None
    first = heapq.nsmallest(DOCUMENT_CONSUMERS, stream.require_consumers().items())
    return StreamDocument(
        stream_id=d.stream_id,
        run_id=stream.key.run_id,
        direction=d.direction,
        content_class=d.content_class,
        schema=d.schema,
        limits=d.limits,
        retention=d.retention,
        redaction=d.redaction,
        placement=d.placement,
        authorization=d.authorization,
        expiry=d.expiry,
        created_at=s.created_at,
        state=StreamStateView(
            head=s.head,
            earliest=s.earliest,
            closed=s.closed,
            closed_at=s.closed_at,
            legal_hold=LegalHoldView(
                enabled=s.legal_hold.enabled,
                reason=s.legal_hold.reason,
                updated_at=s.legal_hold.updated_at,
            ),
            total_items=s.total_items,
            total_bytes=s.total_bytes,
            consumer_count=s.consumer_count,
            consumers=[
                ConsumerView(
                    consumer_id=cid, acked_sequence=c.acked_sequence, holds_credit=c.holds_credit
                )
                for cid, c in first
            ],
            credit=stream.credit(),
            open_objects=[
                open_object_view(i) for i in open_intents(stream)[:DOCUMENT_OPEN_OBJECTS]
            ],
            open_objects_count=len(s.objects),
            open_objects_bytes=sum(i.size for i in s.objects.values()),
            input_delivery=input_delivery,
        ),
        content_type=msgspec.UNSET if d.content_type is None else d.content_type,
        fork=msgspec.UNSET
        if d.fork is None
        else ForkView(d.fork.run_id, d.fork.stream_id, d.fork.source_created_at, d.fork.through),
    )


class StreamList(msgspec.Struct, frozen=True):
    streams: list[StreamDocument]
    next_after: str | None = None  # the last stream_id answered, or null when no stream follows


class AppendAnswer(msgspec.Struct, frozen=True):
    first_sequence: int
    last_sequence: int
    head: int
    credit: Credit


class AckAnswer(msgspec.Struct, frozen=True):
    consumer_id: str
    acked_sequence: int
    credit: Credit


class RecordView(msgspec.Struct, frozen=True, omit_defaults=True):
    sequence: int
    appended_at: datetime
    size: int
    content_type: str
    data: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    data_base64: str | msgspec.UnsetType = msgspec.UNSET
    object: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


def record_view(record: StoredRecord) -> RecordView:
    if record.kind == RecordKind.OBJECT:
        return RecordView(
            sequence=record.sequence,
            appended_at=record.appended_at,
            size=record.size,
            content_type=record.content_type,
            object=msgspec.Raw(record.payload),
        )
    if record.kind == RecordKind.JSON:
        return RecordView(
            sequence=record.sequence,
            appended_at=record.appended_at,
            size=record.size,
            content_type=record.content_type,
            data=msgspec.Raw(record.payload),
        )
    return RecordView(
        sequence=record.sequence,
        appended_at=record.appended_at,
        size=record.size,
        content_type=record.content_type,
        data_base64=base64.b64encode(record.payload).decode(),
    )


class RecordsPage(msgspec.Struct, frozen=True):
    records: list[RecordView]
    next_cursor: int
    head: int
    earliest: int
    closed: bool


# --- the records' JSON, fast ---------------------------------------------------------------------
#
# A catch-up encodes a million records: building a RecordView per record and encoding each cost
# more than reading them (docs/architecture.md, "Catch-up reads"). `RecordsEncoder` writes the
# bytes msgspec writes for `record_view(record)` (tests/unit/test_record_json.py holds it to
# that) with one bytes template per kind, and encodes each distinct appended_at (the records of
# one append share theirs) and content type once.

_encode = msgspec.json.Encoder().encode
_FIELDS = b'{"sequence":%d,"appended_at":%s,"size":%d,"content_type":%s,'
_BY_KIND = {
    RecordKind.JSON: b'"data":%s}',
    RecordKind.BINARY: b'"data_base64":"%s"}',
    RecordKind.OBJECT: b'"object":%s}',
}
_CACHED = 4_096  # distinct appended_at (content types) kept before the memo starts again
_times: dict[datetime, bytes] = {}
_types: dict[str, bytes] = {}


def _time_json(at: datetime) -> bytes:
    if at.tzinfo is not UTC:  # equal datetimes in other zones encode differently: not memoized
        return _encode(at)
    if len(_times) >= _CACHED:
        _times.clear()
    encoded = _times[at] = _encode(at)
    return encoded


def _type_json(content_type: str) -> bytes:
    if len(_types) >= _CACHED:
        _types.clear()
    encoded = _types[content_type] = _encode(content_type)
    return encoded


class RecordsEncoder:
    """Each record as `before` + its RecordView's JSON + `after`; `before` may start with one
    `%d`, the record's sequence (`with_sequence`), as an SSE event's id does."""

    __slots__ = ("_binary", "_json", "_object", "_with_sequence")

    def __init__(self, before: bytes = b"", after: bytes = b"", *, with_sequence: bool = False):
        def template(kind: RecordKind) -> bytes:
            return before + _FIELDS + _BY_KIND[kind] + after.replace(b"%", b"%%")

        self._json = template(RecordKind.JSON)
        self._binary = template(RecordKind.BINARY)
        self._object = template(RecordKind.OBJECT)
        self._with_sequence = with_sequence

    def __call__(self, records: Sequence[StoredRecord]) -> list[bytes]:
        out: list[bytes] = []
        add = out.append
        times, types, UTC_ = _times, _types, UTC
        json_kind, binary_kind = RecordKind.JSON, RecordKind.BINARY  # == : a plain int matches
        with_sequence = self._with_sequence
        for r in records:
            at = r.appended_at
            t = times.get(at) if at.tzinfo is UTC_ else None
            if t is None:
                t = _time_json(at)
            ct = types.get(r.content_type)
            if ct is None:
                ct = _type_json(r.content_type)
            kind, payload = r.kind, r.payload
            if kind == json_kind:
                template = self._json
            elif kind == binary_kind:
                template, payload = self._binary, base64.b64encode(payload)
            else:
                template = self._object
            if with_sequence:
                add(template % (r.sequence, r.sequence, t, r.size, ct, payload))
            else:
                add(template % (r.sequence, t, r.size, ct, payload))
        return out


records_json = RecordsEncoder()
_PAGE_TAIL = b'],"next_cursor":%d,"head":%d,"earliest":%d,"closed":%s}'


class StoredPage(msgspec.Struct, frozen=True):
    """A page as read, before its records become views: `view()` is the RecordsPage, `json()`
    the bytes msgspec writes for it, written without building the views."""

    records: list[StoredRecord]
    next_cursor: int
    head: int
    earliest: int
    closed: bool

    def view(self) -> RecordsPage:
        return RecordsPage(
            records=[record_view(r) for r in self.records],
            next_cursor=self.next_cursor,
            head=self.head,
            earliest=self.earliest,
            closed=self.closed,
        )

    def json(self) -> bytes:
        return (
            b'{"records":['
            + b",".join(records_json(self.records))
            + _PAGE_TAIL
            % (self.next_cursor, self.head, self.earliest, b"true" if self.closed else b"false")
        )
