"""What happened to a stream. Every event carries the stream version it creates.

Events are frozen msgspec Structs with a tag, stored as `(stream, version, type, payload)` and
decoded as one tagged union, so the journal replays into exactly the state that was snapshotted.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from domain.definition import StreamDefinition
from domain.objects import ObjectIntent
from domain.producers import ProducerClaim
from domain.state import StreamState


class Event(msgspec.Struct, frozen=True, tag_field="type"):
    version: int
    at: datetime


class StreamCreated(Event, frozen=True, tag="stream_created"):
    definition: StreamDefinition


class StreamSnapshotted(Event, frozen=True, tag="stream_snapshot"):
    """The whole state at `version` (its own), and the definition: a journal may start here.
    Every event before it is redundant, and the compaction job removes them."""

    definition: StreamDefinition
    state: StreamState


class RecordsAppended(Event, frozen=True, tag="records_appended", omit_defaults=True):
    """Records `first_sequence..last_sequence`; their bytes follow `first_offset` contiguously.

    A Durable Streams append may carry its producer claim (accepted with it) and its writer
    sequence (`Stream-Seq`, the stream's last from then on); a native append carries neither,
    and its journal entry is what it always was."""

    first_sequence: int
    last_sequence: int
    first_offset: int
    bytes: int
    producer: ProducerClaim | None = None
    writer_seq: str | None = None


class ConsumerAcknowledged(Event, frozen=True, tag="consumer_acknowledged", omit_defaults=True):
    """`holds_credit`: whether the consumer holds the writers back, decided at its first ack
    (and carried by every later one, so that replay needs nothing but the events)."""

    consumer_id: str
    principal: str
    sequence: int
    offset: int
    holds_credit: bool = True


class ConsumerRemoved(Event, frozen=True, tag="consumer_removed"):
    """An admin removed the consumer: whatever it held back is released."""

    consumer_id: str


class StreamClosed(Event, frozen=True, tag="stream_closed", omit_defaults=True):
    """The stream takes no more records. `producer`: the claim of the request that closed it
    (accepted with it, if a close-only request; already by its `RecordsAppended` otherwise);
    `writer_seq`: a close-only request's `Stream-Seq`."""

    producer: ProducerClaim | None = None
    writer_seq: str | None = None


class LegalHoldChanged(Event, frozen=True, tag="legal_hold_changed"):
    enabled: bool
    reason: str | None


class RecordsPruned(Event, frozen=True, tag="records_pruned"):
    """Every record up to `through_sequence` is gone; `pruned_bytes` is the offset after it."""

    through_sequence: int
    pruned_bytes: int
    reason: str


class ObjectPrepared(Event, frozen=True, tag="object_prepared"):
    intent: ObjectIntent


class ObjectUploaded(Event, frozen=True, tag="object_uploaded"):
    object_id: str


class ObjectCommitted(Event, frozen=True, tag="object_committed"):
    object_id: str
    sequence: int


class ObjectAborted(Event, frozen=True, tag="object_aborted"):
    object_id: str


class ObjectExpired(Event, frozen=True, tag="object_expired"):
    object_id: str


class StreamDeleted(Event, frozen=True, tag="stream_deleted"):
    """The stream is erased: its records, journal, receipts, consumers, deliveries and intents go."""  # noqa: E501

    reason: str  # "deleted" (DELETE) or "expired" (expiry)


class StreamSoftDeleted(Event, frozen=True, tag="stream_soft_deleted"):
    """Deleted (or expired) while forks still read its records: it answers 410 from now on and
    is erased, in the transaction that erases its last fork."""

    reason: str  # "deleted" or "expired"


AnyEvent = (
    StreamCreated
    | StreamSnapshotted
    | RecordsAppended
    | ConsumerAcknowledged
    | ConsumerRemoved
    | StreamClosed
    | LegalHoldChanged
    | RecordsPruned
    | ObjectPrepared
    | ObjectUploaded
    | ObjectCommitted
    | ObjectAborted
    | ObjectExpired
    | StreamDeleted
    | StreamSoftDeleted
)

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(AnyEvent)


def event_type(event: Event) -> str:
    tag = type(event).__struct_config__.tag
    assert isinstance(tag, str)  # every event is tagged with its name (`tag=` above)
    return tag


def encode_event(event: Event) -> bytes:
    return _encoder.encode(event)


def decode_event(payload: bytes) -> AnyEvent:
    return _decoder.decode(payload)
