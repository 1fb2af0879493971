"""The offsets of a stored stream (domain/offsets.py): its incarnation and, for a fork, its
chain's, read through the record reader's caches (a fork's chain once per incarnation)."""

from __future__ import annotations

from datetime import datetime

from application.ports import RecordReader
from domain.offsets import Minting
from domain.stream import StreamKey


async def minting_of(
    reader: RecordReader, key: StreamKey, created_at: datetime | None = None, *, fork: bool = True
) -> Minting:
    """The offsets of the stream created at `created_at` (None: as the reader knows it now).
    `fork=False`: the caller knows it is no fork, and its chain is not asked for."""
    if created_at is None:
        created_at = await reader.created_at(key)
    if not fork:
        return Minting(created_at)
    chain = await reader.chain(key, created_at)
    return Minting(created_at, ((link.source_created_at, link.through) for link in chain))
