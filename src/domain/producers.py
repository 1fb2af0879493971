"""Idempotent producers (Durable Streams `Producer-Id` / `Producer-Epoch` / `Producer-Seq`) and
the per-stream writer sequence (`Stream-Seq`).

A stream keeps, per producer, its epoch, the highest sequence accepted in that epoch and when it
last wrote: O(1) per producer, in the stream's state, changed only by the events that carry a
claim. The number of producers a stream remembers is bounded (`MAX_PRODUCERS`): past it, the one
that wrote least recently is forgotten, and is treated as new if it ever writes again."""

from __future__ import annotations

import msgspec

from domain.definition import MAX_EXACT_INTEGER
from domain.errors import InvalidInput

# The state is rewritten with every append, so the producers it holds are bounded; 1,000 short
# producer IDs are some 60 KB.
MAX_PRODUCERS = 1_000
MAX_PRODUCER_ID_LENGTH = 255
MAX_WRITER_SEQ_LENGTH = 255


class ProducerClaim(msgspec.Struct, frozen=True):
    """What one append says of its producer: who, which session (epoch) and which batch (seq)."""

    producer_id: str
    epoch: int
    seq: int


def check_claim(claim: ProducerClaim) -> None:
    """A claim's own validity, before any stream is looked at (400 otherwise)."""
    if not 1 <= len(claim.producer_id) <= MAX_PRODUCER_ID_LENGTH:
        raise InvalidInput(
            f"a producer ID is 1 to {MAX_PRODUCER_ID_LENGTH} characters", field="producer_id"
        )
    if not claim.producer_id.isprintable():
        raise InvalidInput("a producer ID holds printable characters only", field="producer_id")
    for name, value in (("epoch", claim.epoch), ("seq", claim.seq)):
        if not 0 <= value <= MAX_EXACT_INTEGER:
            raise InvalidInput(
                f"a producer {name} is a whole number from 0 to {MAX_EXACT_INTEGER}",
                field=f"producer_{name}",
            )


def check_writer_seq(writer_seq: str) -> None:
    if not 1 <= len(writer_seq) <= MAX_WRITER_SEQ_LENGTH:
        raise InvalidInput(
            f"a writer sequence (Stream-Seq) is 1 to {MAX_WRITER_SEQ_LENGTH} characters",
            field="writer_seq",
        )
    if not writer_seq.isprintable():
        raise InvalidInput(
            "a writer sequence (Stream-Seq) holds printable characters only", field="writer_seq"
        )
