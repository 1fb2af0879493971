"""A stream's state: what the snapshot on the stream row holds, and what a `StreamSnapshotted`
event carries in the journal. Its own module so that events can carry it without importing the
aggregate (the aggregate imports the events)."""

from __future__ import annotations

from datetime import datetime

import msgspec

from domain.objects import ObjectIntent
from domain.producers import ProducerClaim


class Consumer(msgspec.Struct, forbid_unknown_fields=True):
    principal: str
    acked_sequence: int
    acked_offset: int
    updated_at: datetime


class Producer(msgspec.Struct, forbid_unknown_fields=True):
    """An idempotent producer: its epoch, the highest sequence accepted in it, its last write."""

    epoch: int
    last_seq: int
    updated_at: datetime


class LegalHold(msgspec.Struct, forbid_unknown_fields=True):
    enabled: bool = False
    reason: str | None = None
    updated_at: datetime | None = None


class StreamState(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """The snapshot. `earliest` is the lowest retained sequence (head + 1 when none is).

    Fields at their defaults are left out of the encoding: the state is rewritten with every
    append, and most streams never use the writer fields (`producers`, `writer_seq`,
    `closed_by`), so they cost nothing there.

    A fork (`definition.fork`) starts at `head = earliest - 1 = fork.through`: sequences up to
    `through` are the source's (read through it, never copied, never counted here), so its
    totals, credit and retention count only its own records."""

    version: int = 0
    created_at: datetime | None = None
    head: int = 0
    earliest: int = 1
    total_items: int = 0
    total_bytes: int = 0
    pruned_bytes: int = 0
    closed: bool = False
    closed_at: datetime | None = None
    legal_hold: LegalHold = msgspec.field(default_factory=LegalHold)
    consumers: dict[str, Consumer] = msgspec.field(default_factory=dict)
    objects: dict[str, ObjectIntent] = msgspec.field(default_factory=dict)  # open intents only
    # Durable Streams writer state: idempotent producers by ID, the last `Stream-Seq`, and the
    # producer claim whose request closed the stream (its retry is a duplicate, not a refusal).
    producers: dict[str, Producer] = msgspec.field(default_factory=dict)
    writer_seq: str | None = None
    closed_by: ProducerClaim | None = None
    deleted: bool = False  # erased: nothing is decided after it (never stored: the row goes)
    # Deleted (or expired) while forks still read its records: every direct operation answers
    # StreamGone; the row and records stay until its last fork is gone (then it is erased).
    soft_deleted: bool = False


_state_encoder = msgspec.json.Encoder()
_state_decoder = msgspec.json.Decoder(StreamState)


def encode_state(state: StreamState) -> bytes:
    return _state_encoder.encode(state)


def decode_state(payload: bytes) -> StreamState:
    return _state_decoder.decode(payload)


def copy_state(state: StreamState) -> StreamState:
    """A deep copy that shares nothing mutable (consumers, objects) with `state`: exactly what a
    round trip through storage gives back."""
    return decode_state(encode_state(state))
