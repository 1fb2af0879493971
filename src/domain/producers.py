"""Idempotent producers (Durable Streams `Producer-Id` / `Producer-Epoch` / `Producer-Seq`)."""

from __future__ import annotations

import msgspec


class ProducerClaim(msgspec.Struct, frozen=True):
    """What one append says of its producer: who, which session (epoch) and which batch (seq)."""

    producer_id: str
    epoch: int
    seq: int
