"""Live delivery: one tail per followed stream per process, shared by every local subscriber.

On each wake, a stream's tail reads the new records once (a keyset page from the source of
truth) into a bounded ring and tells its subscribers; the database work per append does not
depend on how many clients follow the stream. A subscriber pulls from the ring by its own
cursor. When it is behind the ring (it started from an old cursor, or it was too slow to keep up
while the ring moved on), it reads keyset pages from PostgreSQL instead: memory stays bounded and
no record is ever dropped. It delivers only `last + 1`, so boundary duplicates cannot happen; a
record that is not `last + 1` is a gap, read from the source before going on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator

import msgspec

from application.ports import RecordReader, StoredRecord
from application.wake import WakeRegistry
from domain.stream import StreamKey

PAGE = 1_000


class RecordsDelivered(msgspec.Struct, frozen=True):
    records: list[StoredRecord]


class Idle(msgspec.Struct, frozen=True):
    """Nothing happened for a heartbeat interval."""


class StreamEnded(msgspec.Struct, frozen=True):
    """The stream is closed and every record up to `head` was delivered."""

    head: int


class Overtaken(msgspec.Struct, frozen=True):
    """Retention removed the next record this subscriber needed (the 410 fields)."""

    requested: int
    earliest: int
    latest: int
    reason: str = "retention"


Delivery = RecordsDelivered | Idle | StreamEnded | Overtaken


class StreamTail:
    def __init__(
        self,
        key: StreamKey,
        reader: RecordReader,
        wake: WakeRegistry,
        ring_records: int,
        ring_bytes: int,
        recheck_seconds: float,
    ) -> None:
        self.key = key
        self._reader = reader
        self._wake = wake
        self._ring: deque[StoredRecord] = deque()
        self._ring_bytes = 0
        self._max_records = ring_records
        self._max_bytes = ring_bytes
        self._recheck = recheck_seconds
        self.position = 0  # the highest sequence read
        self.head = 0
        self.earliest = 1
        self.closed = False
        self.reads = 0
        self.subscribers = 0
        self.changed = asyncio.Event()
        self.ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self, listening: contextlib.AbstractContextManager) -> None:
        self._task = asyncio.create_task(self._follow(listening), name=f"tail {self.key}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _follow(self, listening: contextlib.AbstractContextManager) -> None:
        with listening as listener:
            first = True
            while True:
                try:
                    await self._read_new(skip_history=first)
                    first = False
                    self.ready.set()
                except asyncio.CancelledError:
                    raise
                except Exception:  # the database blinked: the next wake or recheck retries
                    await asyncio.sleep(0.5)
                    continue
                await listener.wait(self._recheck)

    async def _read_new(self, *, skip_history: bool) -> None:
        if skip_history:
            # A new tail starts at the head: subscribers behind it backfill from the source.
            found = await self._reader.page(self.key, 0, 1)
            if found is None:
                return
            position, _ = found
            self.position = position.head
            self._publish(position.head, position.earliest, position.closed)
            return
        while True:
            found = await self._reader.page(self.key, self.position, PAGE)
            self.reads += 1
            if found is None:
                return
            position, records = found
            for record in records:
                if record.sequence != self.position + 1:
                    # Retention removed what the ring would hold: restart it past the gap.
                    self._ring.clear()
                    self._ring_bytes = 0
                self._ring.append(record)
                self._ring_bytes += record.size
                self.position = record.sequence
            while self._ring and (
                len(self._ring) > self._max_records or self._ring_bytes > self._max_bytes
            ):
                self._ring_bytes -= self._ring.popleft().size
            self._publish(position.head, position.earliest, position.closed)
            if len(records) < PAGE:
                return

    def _publish(self, head: int, earliest: int, closed: bool) -> None:
        self.head, self.earliest, self.closed = max(head, self.position), earliest, closed
        self.wake_followers()

    def wake_followers(self) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()
        self.ready.set()

    def after(self, last: int) -> list[StoredRecord] | None:
        """Records after `last` from the ring, or None if the ring does not reach back to it."""
        if not self._ring or last >= self.position:
            return [] if last >= self.position else None
        first = self._ring[0].sequence
        if last + 1 < first:
            return None
        start = last + 1 - first
        return [self._ring[i] for i in range(start, min(len(self._ring), start + PAGE))]


class LiveTails:
    """The tails of this process, created on a stream's first subscriber, ended on its last."""

    def __init__(
        self,
        reader: RecordReader,
        wake: WakeRegistry,
        ring_records: int = 4_096,
        ring_bytes: int = 8 * 1024 * 1024,
        recheck_seconds: float = 15.0,
    ) -> None:
        self._reader = reader
        self._wake = wake
        self._tails: dict[StreamKey, StreamTail] = {}
        self.ending = False
        self._ring_records = ring_records
        self._ring_bytes = ring_bytes
        self._recheck = recheck_seconds

    def tail(self, key: StreamKey) -> StreamTail | None:
        return self._tails.get(key)

    def end_all(self) -> None:
        """The process is stopping: every follower ends at its next step (its subscriber
        resumes elsewhere from its last event id), so the server can finish draining."""
        self.ending = True
        for tail in self._tails.values():
            tail.wake_followers()

    @contextlib.asynccontextmanager
    async def joined(self, key: StreamKey) -> AsyncIterator[StreamTail]:
        tail = self._tails.get(key)
        if tail is None:
            tail = StreamTail(
                key, self._reader, self._wake, self._ring_records, self._ring_bytes, self._recheck
            )
            self._tails[key] = tail
            # The tail listens before anything is read: the wake channel is established first.
            tail.start(self._wake.listen(key))
        tail.subscribers += 1
        try:
            yield tail
        finally:
            tail.subscribers -= 1
            if tail.subscribers == 0 and self._tails.get(key) is tail:
                del self._tails[key]
                await tail.stop()

    async def follow(
        self, key: StreamKey, cursor: int, heartbeat_seconds: float
    ) -> AsyncIterator[Delivery]:
        """Every record with sequence > cursor, ascending, without gaps or duplicates; `Idle`
        while nothing happens; then `StreamEnded` once closed and delivered, or `Overtaken`."""
        async with self.joined(key) as tail:
            await tail.ready.wait()
            last = cursor
            while not self.ending:
                changed = tail.changed  # taken before looking, so no change is missed
                records = tail.after(last)
                if records is None:  # behind the ring: read the source by keyset pages
                    found = await self._reader.page(key, last, PAGE)
                    if found is None:
                        return
                    position, records = found
                    if (records and records[0].sequence != last + 1) or (
                        not records and last + 1 < position.earliest
                    ):
                        yield Overtaken(
                            requested=last + 1, earliest=position.earliest, latest=position.head
                        )
                        return
                if records:
                    if records[0].sequence != last + 1:
                        continue  # the ring moved on meanwhile: reread from the source
                    last = records[-1].sequence
                    yield RecordsDelivered(records)
                    continue
                if tail.closed and last >= tail.head:
                    yield StreamEnded(head=tail.head)
                    return
                try:
                    # asyncio.timeout, not wait_for: no extra task per subscriber per wake.
                    async with asyncio.timeout(heartbeat_seconds):
                        await changed.wait()
                except TimeoutError:
                    yield Idle()
