"""A stream's state: what the snapshot on the stream row holds, and what a `StreamSnapshotted`
event carries in the journal. Its own module so that events can carry it without importing the
aggregate (the aggregate imports the events)."""

from __future__ import annotations

from datetime import datetime

import msgspec

from domain.objects import ObjectIntent
from domain.producers import ProducerClaim


class Consumer(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """A consumer's acknowledgement. `holds_credit` is decided when the consumer is created:
    one created by a principal that may write the stream (or an admin) holds the writers back
    until it reads; one created by a principal that may only read tracks its position and
    holds nothing back. Consumers stored before the rule existed hold credit, as they did."""

    principal: str
    acked_sequence: int
    acked_offset: int
    updated_at: datetime
    holds_credit: bool = True


class CreditFloor(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The slowest consumer that holds credit: its acknowledged sequence and the cumulative
    offset after it. Kept in the state so that an append never looks at the consumers."""

    sequence: int
    offset: int


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
    # Every consumer, by ID; but see `consumers_loaded`: the PostgreSQL adapter stores them
    # beside the snapshot and reads them only for a decision that needs them (an ack, a
    # removal, a snapshot, a document), so that an append costs the same with 5 or 5,000.
    consumers: dict[str, Consumer] = msgspec.field(default_factory=dict)
    consumer_count: int = 0  # len(consumers) when they are loaded
    holding_count: int = 0  # of them, those that hold credit
    credit_floor: CreditFloor | None = None  # None: no consumer holds credit
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

    def __post_init__(self) -> None:
        # A state stored before the counts existed held its consumers and nothing else: derive
        # them (a state whose consumers are not loaded has counts, so this never runs on one).
        if self.consumers and not self.consumer_count:
            self.consumer_count = len(self.consumers)
            self.holding_count = sum(c.holds_credit for c in self.consumers.values())
            self.credit_floor = slowest_holding(self.consumers)

    @property
    def consumers_loaded(self) -> bool:
        return len(self.consumers) == self.consumer_count


def slowest_holding(consumers: dict[str, Consumer]) -> CreditFloor | None:
    """The credit floor over every consumer: O(consumers), run only when the slowest one moves
    on or goes."""
    floor = min(
        ((c.acked_sequence, c.acked_offset) for c in consumers.values() if c.holds_credit),
        default=None,
    )
    return None if floor is None else CreditFloor(sequence=floor[0], offset=floor[1])


class ConsumersNotLoaded(Exception):
    """A decision needs the consumers and the state was read without them: the adapter reads
    them and decides again. Not a DomainError: no client ever sees it."""


_state_encoder = msgspec.json.Encoder()
_state_decoder = msgspec.json.Decoder(StreamState)


def encode_state(state: StreamState) -> bytes:
    return _state_encoder.encode(state)


def encode_state_without_consumers(state: StreamState) -> bytes:
    """The snapshot an adapter rewrites with every group commit: O(1) in the consumers (the
    replace is shallow; the counts and the credit floor stay)."""
    return _state_encoder.encode(msgspec.structs.replace(state, consumers={}))


_consumers_decoder = msgspec.json.Decoder(dict[str, Consumer])


def encode_consumers(consumers: dict[str, Consumer]) -> bytes:
    return _state_encoder.encode(consumers)


def decode_consumers(payload: bytes) -> dict[str, Consumer]:
    return _consumers_decoder.decode(payload)


def decode_state(payload: bytes) -> StreamState:
    return _state_decoder.decode(payload)


def copy_state(state: StreamState) -> StreamState:
    """A deep copy that shares nothing mutable (consumers, objects) with `state`: exactly what a
    round trip through storage gives back."""
    return decode_state(encode_state(state))
