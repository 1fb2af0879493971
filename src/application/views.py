"""What the use cases answer: plain msgspec Structs the entrypoints encode as they are."""

from __future__ import annotations

import base64
from datetime import datetime
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
from domain.records import RecordKind
from domain.stream import Credit, Stream


class ConsumerView(msgspec.Struct, frozen=True):
    consumer_id: str
    acked_sequence: int


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


class StreamStateView(msgspec.Struct, frozen=True, omit_defaults=True):
    head: int
    earliest: int
    closed: bool
    closed_at: datetime | None
    legal_hold: LegalHoldView
    total_items: int
    total_bytes: int
    consumers: list[ConsumerView]
    credit: Credit
    open_objects: list[OpenObjectView]
    input_delivery: InputDeliveryStatus | msgspec.UnsetType = msgspec.UNSET


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


def stream_document(
    stream: Stream, input_delivery: InputDeliveryStatus | msgspec.UnsetType = msgspec.UNSET
) -> StreamDocument:
    d, s = stream.definition, stream.state
    assert s.created_at is not None
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
            consumers=[
                ConsumerView(consumer_id=cid, acked_sequence=c.acked_sequence)
                for cid, c in sorted(s.consumers.items())
            ],
            credit=stream.credit(),
            open_objects=[
                OpenObjectView(
                    object_id=i.object_id,
                    state=i.state,
                    size=i.size,
                    content_type=i.content_type,
                    created_at=i.created_at,
                    expires_at=i.expires_at,
                )
                for i in sorted(s.objects.values(), key=lambda i: (i.created_at, i.object_id))
            ],
            input_delivery=input_delivery,
        ),
    )


class StreamList(msgspec.Struct, frozen=True):
    streams: list[StreamDocument]


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
