"""The producer's batching rules: `Batcher` buffers encoded records and cuts them into
`Batch`es, each one append with its own idempotency key."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ductor_streams_client._core.wire import (
    MAX_BATCH_RECORDS,
    MAX_REQUEST_BYTES,
    append_body,
    new_key,
)


@dataclass
class Batch:
    """One append of the producer: its records (encoded) and its own idempotency key, which
    every retry of it reuses."""

    parts: list[bytes]
    nbytes: int
    key: str = field(default_factory=new_key)

    @property
    def count(self) -> int:
        return len(self.parts)

    def body(self) -> bytes:
        return append_body(self.parts)


class Batcher:
    """The producer's buffer: records wait here until a batch is full (`max_batch_records` or
    `max_batch_bytes`), or `linger` seconds passed since the oldest arrived, or a flush asks.
    It holds at most `max_buffered_records` / `max_buffered_bytes` (`room`): a full buffer makes
    `send` wait, which is how the stream's backpressure reaches the program."""

    def __init__(
        self,
        *,
        max_batch_records: int = MAX_BATCH_RECORDS,
        max_batch_bytes: int = 1024 * 1024,
        linger: float = 0.005,
        max_buffered_records: int = 10_000,
        max_buffered_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        if not 1 <= max_batch_records <= MAX_BATCH_RECORDS:
            raise ValueError(f"max_batch_records must be 1 to {MAX_BATCH_RECORDS}")
        if not 1 <= max_batch_bytes <= MAX_REQUEST_BYTES - 64 * 1024:
            raise ValueError("max_batch_bytes must leave room under the 8 MiB request ceiling")
        if linger < 0:
            raise ValueError("linger must be 0 or more")
        self.max_batch_records = max_batch_records
        self.max_batch_bytes = max_batch_bytes
        self.linger = linger
        self.max_buffered_records = max(max_buffered_records, max_batch_records)
        self.max_buffered_bytes = max(max_buffered_bytes, max_batch_bytes)
        self._parts: deque[bytes] = deque()
        self.buffered_bytes = 0
        self.oldest_at: float | None = None
        self.added = 0  # records ever added
        self.taken = 0  # records ever taken into batches

    def __len__(self) -> int:
        return len(self._parts)

    def room(self, nbytes: int) -> bool:
        """Whether a record of `nbytes` fits now (an empty buffer takes any record)."""
        if not self._parts:
            return True
        return (
            len(self._parts) < self.max_buffered_records
            and self.buffered_bytes + nbytes <= self.max_buffered_bytes
        )

    def add(self, part: bytes, now: float) -> bool:
        """Buffer one encoded record; True when that made a batch ready (the first record, or a
        full batch), so the sender knows to wake the flusher."""
        if len(part) > self.max_batch_bytes:
            raise ValueError(
                f"a record of {len(part)} bytes encoded is over max_batch_bytes "
                f"({self.max_batch_bytes}); send it as an object"
            )
        first = not self._parts
        self._parts.append(part)
        self.buffered_bytes += len(part) + 1
        self.added += 1
        if first:
            self.oldest_at = now
        return first or self.full()

    def full(self) -> bool:
        return (
            len(self._parts) >= self.max_batch_records
            or self.buffered_bytes >= self.max_batch_bytes
        )

    def wait(self, now: float, flushing: bool) -> float | None:
        """Seconds until a batch is due (0: now), or None when nothing is buffered."""
        if not self._parts:
            return None
        if flushing or self.full() or self.oldest_at is None:
            return 0.0
        return max(0.0, self.oldest_at + self.linger - now)

    def drop(self) -> None:
        """Forget what is buffered (it counts as never appended)."""
        self._parts.clear()
        self.buffered_bytes = 0
        self.oldest_at = None

    def take(self, now: float) -> Batch:
        """The next batch, oldest records first, within both batch ceilings."""
        parts: list[bytes] = []
        nbytes = 0
        while self._parts and len(parts) < self.max_batch_records:
            size = len(self._parts[0]) + 1
            if parts and nbytes + size > self.max_batch_bytes:
                break
            parts.append(self._parts.popleft())
            nbytes += size
        self.buffered_bytes -= nbytes
        self.taken += len(parts)
        self.oldest_at = now if self._parts else None
        return Batch(parts, nbytes)
