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
import logging
import random
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from datetime import datetime

import msgspec

from application import tracing
from application.ports import RecordReader, StoredRecord, within_bytes
from application.tokens import Lease
from application.wake import Listener, WakeRegistry
from domain.stream import StreamKey

PAGE = 1_000
# A delivery made for one follower (from the ring behind its newest batch, or read from the
# source) holds at most this many payload bytes (and at least one record): a follower that
# stops reading holds one delivery, and its encoding, in its transport's send. Pages of 1,000
# records of up to 64 KiB each once held 46 MB per stalled follower.
DELIVERY_BYTES = 256 * 1024

log = logging.getLogger("ductor_streams.live")

# A tail that cannot read (the database is out of reach) retries after a pause that doubles
# from RETRY_FIRST_SECONDS up to RETRY_MAX_SECONDS, jittered so that the tails of a process do
# not all retry at once. The bound is what a follower waits at most, once PostgreSQL is back,
# before its tail reads again: its wake bus meanwhile wakes it every 0.25 s while not live, and
# a retry on each of those would be four reads a second per followed stream against a database
# that is not answering.
RETRY_FIRST_SECONDS = 0.05
RETRY_MAX_SECONDS = 1.0
# How long a process's tail of a stream goes on after its last follower left
# (`LiveTails(linger_seconds=)`): longer than the moment between a long-poll's answer and its
# next poll, short enough that a stream nobody follows any more costs a few reads at most.
TAIL_LINGER_SECONDS = 5.0
# At most this many tails of a process linger at once (`LiveTails(max_lingering=)`); one more
# retires the one that has lingered longest. A tail nobody follows still reads every append
# of its stream and keeps its ring: short polls over thousands of streams would otherwise keep
# a tail (a task, a listener, a ring of up to 8 MiB) per stream polled in the last 5 s.
MAX_LINGERING_TAILS = 1_024


class TailOutages:
    """The tails of a process that cannot read, as one outage: logged once when the first fails
    and once when reads succeed again, counted for /metrics."""

    def __init__(self) -> None:
        self.failing: set[StreamKey] = set()
        self.open = False  # an outage is under way: no tail has read since one failed
        self.episodes = 0  # outages since start
        self.failures = 0  # failed reads since start
        self._since = 0.0

    def failed(self, key: StreamKey, error: Exception, retry_max: float) -> None:
        self.failures += 1
        self.failing.add(key)
        if not self.open:
            self.open = True
            self.episodes += 1
            self._since = time.monotonic()
            log.warning(
                "live delivery cannot read the streams it follows (%s: %s); their tails retry, "
                "backing off up to %.1f s",
                type(error).__name__,
                error,
                retry_max,
            )

    def read(self, key: StreamKey) -> None:
        """A tail read: the outage ends when no tail that failed is still failing."""
        self.failing.discard(key)
        if self.open and not self.failing:
            self.open = False
            log.warning("live delivery reads again after %.1f s", time.monotonic() - self._since)

    def left(self, key: StreamKey) -> None:
        """A tail stopped (its last follower left): it is not failing any more, but the outage
        is not over until a tail reads again."""
        self.failing.discard(key)


class RecordsDelivered:
    """Records in order. The tail hands one such delivery to every follower at the same
    position, so a transport can encode it once for all of them (`encoded_as`, memoized per
    encoder function object: pass the same function each time). Shared: never modify it."""

    __slots__ = ("_encoded", "records")
    __match_args__ = ("records",)

    def __init__(self, records: list[StoredRecord]) -> None:
        self.records = records
        self._encoded: tuple[object, bytes] | None = None

    def encoded_as(self, encode: Callable[[list[StoredRecord]], bytes]) -> bytes:
        """`encode(records)`, computed once per delivery (per encoder)."""
        memo = self._encoded
        if memo is None or memo[0] is not encode:
            memo = self._encoded = (encode, encode(self.records))
        return memo[1]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RecordsDelivered) and other.records == self.records

    def __repr__(self) -> str:
        return f"RecordsDelivered({self.records!r})"

    # Unhashable, as any class that defines __eq__ and no __hash__ is.


_NOTHING = RecordsDelivered([])


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


class StreamGone(msgspec.Struct, frozen=True):
    """The stream was deleted: nothing more comes, whatever was not delivered yet."""


class Revoked(msgspec.Struct, frozen=True):
    """The token this follower was admitted with was revoked or expired: nothing more comes."""


Delivery = RecordsDelivered | Idle | StreamEnded | Overtaken | StreamGone | Revoked


# A signal wakes at most this many waiters in one turn of the event loop, then the next slice
# in the next turn: the other requests of the process (another tenant's among them) take their
# turns between the slices, instead of waiting behind every follower of a stream woken at once
# (9,900 long-polls of one stream answered together held the loop for seconds).
SIGNAL_SLICE = 256


class Signal:
    """Wakes everyone waiting on it, once. Lighter than `asyncio.Event` for a thousand waiters
    that are woken together and then wait on the next signal: one future each, never removed
    one by one (a waiter cancelled meanwhile is skipped). Waiters are woken `SIGNAL_SLICE` at
    a time, one slice per turn of the loop, in the order they came."""

    __slots__ = ("_loop", "_waiters", "fired")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiters: list[asyncio.Future[None]] = []
        self.fired = False

    def waiter(self) -> asyncio.Future[None]:
        """A future done when this signal fires (already done if it has)."""
        future = self._loop.create_future()
        if self.fired:
            future.set_result(None)
        else:
            self._waiters.append(future)
        return future

    def fire(self) -> None:
        if self.fired:
            return
        self.fired = True
        waiters, self._waiters = self._waiters, []
        self._wake(waiters, 0)

    def _wake(self, waiters: list[asyncio.Future[None]], start: int) -> None:
        woken = 0
        for index in range(start, len(waiters)):
            future = waiters[index]
            if not future.done():
                if woken == SIGNAL_SLICE:
                    self._loop.call_soon(self._wake, waiters, index)
                    return
                future.set_result(None)
                woken += 1


class StreamTail:
    def __init__(
        self,
        key: StreamKey,
        reader: RecordReader,
        wake: WakeRegistry,
        ring_records: int,
        ring_bytes: int,
        recheck_seconds: float,
        outages: TailOutages | None = None,
        retry_first_seconds: float = RETRY_FIRST_SECONDS,
        retry_max_seconds: float = RETRY_MAX_SECONDS,
    ) -> None:
        self.key = key
        self._outages = outages or TailOutages()
        self._retry_first = retry_first_seconds
        self._retry_max = retry_max_seconds
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
        self.deleted = False
        self.created_at: datetime | None = None  # which stream of this key the tail follows
        self.reads = 0
        self.subscribers = 0
        self._loop = asyncio.get_running_loop()
        self.changed = Signal(self._loop)
        self.ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # The newest page read, shared by every follower that was at its start.
        self._latest = _NOTHING
        # Heartbeats: the tail ticks every half heartbeat and wakes its followers; one that
        # has said nothing for two ticks sends a heartbeat. One timer per stream, instead of a
        # timeout per follower per wake.
        self.ticks = 0
        self._tick_seconds = float("inf")
        self._ticker: asyncio.TimerHandle | None = None

    def start(self, listening: contextlib.AbstractContextManager[Listener]) -> None:
        self._task = asyncio.create_task(self._follow(listening), name=f"tail {self.key}")

    def beat_every(self, heartbeat_seconds: float) -> None:
        """Tick often enough that a follower idle for `heartbeat_seconds` hears a heartbeat.
        (A shorter heartbeat than the tail's restarts its timer, which can stretch the current
        interval of followers already there once; the service uses one heartbeat setting.)"""
        if heartbeat_seconds / 2 < self._tick_seconds:
            self._tick_seconds = heartbeat_seconds / 2
            if self._ticker is not None:
                self._ticker.cancel()
            self._ticker = self._loop.call_later(self._tick_seconds, self._tick)

    def _tick(self) -> None:
        self.ticks += 1
        self._ticker = self._loop.call_later(self._tick_seconds, self._tick)
        self._signal()  # not `ready`: that still means the tail has read once

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _follow(self, listening: contextlib.AbstractContextManager[Listener]) -> None:
        outages = self._outages
        retry = self._retry_first
        try:
            with listening as listener:
                first = True
                while True:
                    try:
                        await self._read_new(skip_history=first)
                    except asyncio.CancelledError:
                        raise
                    except Exception as error:
                        # The database is out of reach (or blinked): retry after a pause that
                        # grows to a bound. A wake meanwhile stays set on the listener.
                        outages.failed(self.key, error, self._retry_max)
                        await asyncio.sleep(retry * random.uniform(0.5, 1.0))
                        retry = min(retry * 2, self._retry_max)
                        continue
                    if outages.open:
                        outages.read(self.key)
                    retry = self._retry_first
                    first = False
                    self.ready.set()
                    if self.deleted:
                        return
                    await listener.wait(self._recheck)
                    if listener.deleted:
                        # A deletion was heard: of this tail's stream, or of an earlier one
                        # under its key (deleted and created again elsewhere, heard late; the
                        # notification names no incarnation). The next read tells: gone, or
                        # another incarnation, ends the tail there.
                        listener.deleted = False
        finally:
            outages.left(self.key)

    def _gone(self) -> None:
        self.deleted = True
        self.wake_followers()

    def follows(self, created_at: datetime) -> bool:
        """Whether this tail follows (or, not having read yet, will follow) the stream created
        then."""
        return self.created_at is None or self.created_at == created_at

    def same_stream(self, created_at: datetime | None) -> bool:
        """Whether a page read now is of the stream this tail follows (not one deleted and
        created again under its key); the first page read says which that is."""
        if self.created_at is None:
            self.created_at = created_at
        return created_at == self.created_at

    async def _read_new(self, *, skip_history: bool) -> None:
        if skip_history:
            # A new tail starts at the head: subscribers behind it backfill from the source.
            found = await self._reader.page(self.key, 0, 1)
            if found is None or found[0].soft_deleted or not self.same_stream(found[0].created_at):
                self._gone()
                return
            position, _ = found
            self.position = position.head
            self._publish(position.head, position.earliest, position.closed)
            return
        while True:
            # At most a ring's bytes a read: what the ring could not keep is not read either.
            found = await self._reader.page(self.key, self.position, PAGE, self._max_bytes)
            self.reads += 1
            if found is None or found[0].soft_deleted or not self.same_stream(found[0].created_at):
                self._gone()
                return
            position, records = found
            contiguous = bool(records) and records[0].sequence == self.position + 1
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
            # The page is shared (with its one encoding) only while the ring still holds all of
            # it, so what the tail keeps stays within the ring's bounds.
            # (An object's record counts its body's size, so the ring can even be empty.)
            whole = (
                contiguous and bool(self._ring) and self._ring[0].sequence <= records[0].sequence
            )
            self._latest = RecordsDelivered(records) if whole else _NOTHING
            self._publish(position.head, position.earliest, position.closed)
            if not records or records[-1].sequence >= position.head:
                return  # read up to the head of this read's snapshot

    def _publish(self, head: int, earliest: int, closed: bool) -> None:
        self.head, self.earliest, self.closed = max(head, self.position), earliest, closed
        self.wake_followers()

    def wake_followers(self) -> None:
        self._signal()
        self.ready.set()

    def _signal(self) -> None:
        changed, self.changed = self.changed, Signal(self._loop)
        changed.fire()

    def after(self, last: int) -> RecordsDelivered | None:
        """Records after `last` from the ring (none if `last` is the newest), or None if the
        ring does not reach back to it. A follower at the start of the newest page gets the
        delivery every other such follower gets."""
        if last >= self.position:
            return _NOTHING
        latest = self._latest.records
        if latest and latest[0].sequence == last + 1 and latest[-1].sequence == self.position:
            return self._latest
        if not self._ring or last + 1 < (first := self._ring[0].sequence):
            return None
        start = last + 1 - first
        return RecordsDelivered(
            within_bytes(
                [self._ring[i] for i in range(start, min(len(self._ring), start + PAGE))],
                DELIVERY_BYTES,
            )
        )


class LiveTails:
    """The tails of this process, created on a stream's first subscriber, ended on its last."""

    def __init__(
        self,
        reader: RecordReader,
        wake: WakeRegistry,
        ring_records: int = 4_096,
        ring_bytes: int = 8 * 1024 * 1024,
        recheck_seconds: float = 15.0,
        retry_first_seconds: float = RETRY_FIRST_SECONDS,
        retry_max_seconds: float = RETRY_MAX_SECONDS,
        linger_seconds: float = 0.0,
        max_lingering: int = MAX_LINGERING_TAILS,
    ) -> None:
        self._reader = reader
        self._wake = wake
        self._tails: dict[StreamKey, StreamTail] = {}
        # A tail whose last follower left goes on this long (with its ring and its place in
        # `_tails`) before it stops: long-polls answered together poll again a moment later,
        # and find the tail there, its position known, instead of each reading the database
        # while a new tail makes its first read.
        self._linger = linger_seconds
        self._max_lingering = max_lingering
        # In the order they began to linger: the first is the one to retire for a newer one.
        self._lingering: dict[StreamTail, asyncio.TimerHandle] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self.outages = TailOutages()
        self._retry = (retry_first_seconds, retry_max_seconds)
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
        for tail in list(self._lingering):
            self._retire(tail)

    @contextlib.asynccontextmanager
    async def joined(
        self, key: StreamKey, created_at: datetime | None = None
    ) -> AsyncIterator[StreamTail]:
        tail = self._tails.get(key)
        if created_at is not None and tail is not None and not tail.follows(created_at):
            found = await self._reader.page(key, 0, 1)
            tail = self._tails.get(key)  # (it may have been replaced or left meanwhile)
            if (
                tail is not None
                and not tail.follows(created_at)
                and found is not None
                and found[0].created_at == created_at
            ):
                # The stream it follows was deleted and created again elsewhere, and this
                # process has not heard yet: its followers are told it is gone, its ring is
                # never served. (Which one is current is read, not judged by the creation
                # times: they come from the creating processes' clocks.)
                tail._gone()
        if tail is None or tail.deleted:  # a stream created again is followed by a new tail
            tail = StreamTail(
                key,
                self._reader,
                self._wake,
                self._ring_records,
                self._ring_bytes,
                self._recheck,
                self.outages,
                *self._retry,
            )
            self._tails[key] = tail
            # The tail listens before anything is read: the wake channel is established first.
            tail.start(self._wake.listen(key))
        if (timer := self._lingering.pop(tail, None)) is not None:
            timer.cancel()
        tail.subscribers += 1
        try:
            yield tail
        finally:
            tail.subscribers -= 1
            if tail.subscribers == 0:
                current = self._tails.get(key) is tail
                if current and self._linger > 0 and not tail.deleted and not self.ending:
                    loop = asyncio.get_running_loop()
                    self._lingering[tail] = loop.call_later(self._linger, self._retire, tail)
                    while len(self._lingering) > self._max_lingering:
                        self._retire(next(iter(self._lingering)))
                else:
                    if current:
                        del self._tails[key]
                    await tail.stop()  # also a deleted tail a newer one replaced

    def _retire(self, tail: StreamTail) -> None:
        """A lingering tail that no follower joined meanwhile stops."""
        timer = self._lingering.pop(tail, None)
        if timer is not None:
            timer.cancel()
        if tail.subscribers:
            return
        if self._tails.get(tail.key) is tail:
            del self._tails[tail.key]
        stopping = asyncio.get_running_loop().create_task(tail.stop(), name=f"stop {tail.key}")
        self._stopping.add(stopping)
        stopping.add_done_callback(self._stopping.discard)

    async def follow(
        self,
        key: StreamKey,
        cursor: int,
        heartbeat_seconds: float,
        lease: Lease | None = None,
        created_at: datetime | None = None,
    ) -> AsyncGenerator[Delivery, None]:
        """Every record with sequence > cursor, ascending, without gaps or duplicates; `Idle`
        while nothing happens; then `StreamEnded` once closed and delivered, or `Overtaken`, or
        `StreamGone` once the stream is deleted, or `Revoked` once `lease` ends (its token was
        revoked or expired: checked before each delivery, and its end wakes the follower).
        `created_at`: the stream the cursor was checked against; another one under its key
        (deleted and created again meanwhile) is `StreamGone`, never its records."""
        async with self.joined(key, created_at) as tail:
            if lease is not None:
                lease.on_end(tail.wake_followers)
            tail.beat_every(heartbeat_seconds)
            spoke = tail.ticks  # the tick of this follower's last word
            while not self.ending:
                changed = tail.changed  # taken before looking, so that `ready` is not missed
                if tail.ready.is_set():
                    break
                # The tail's first read has not come back (the database is out of reach, and
                # the tail retries): the follower hears heartbeats meanwhile, as when idle.
                if tail.ticks - spoke >= 2:
                    spoke = tail.ticks
                    yield Idle()
                    continue
                await changed.waiter()
            if created_at is not None and not tail.follows(created_at):
                yield StreamGone()
                return
            last = cursor
            spoke = tail.ticks
            while not self.ending:
                changed = tail.changed  # taken before looking, so no change is missed
                if lease is not None and lease.ended:
                    yield Revoked()
                    return
                if tail.deleted:
                    yield StreamGone()
                    return
                delivery = tail.after(last)
                if delivery is None:  # behind the ring: read the source by keyset pages
                    # A delivery's bytes at most, cut in the read itself: nothing more of the
                    # source is held while the follower's client takes the delivery (a page
                    # of 1,000 records of 64 KiB each would be 64 MB per follower).
                    found = await self._reader.page(key, last, PAGE, DELIVERY_BYTES)
                    if (
                        found is None
                        or found[0].soft_deleted
                        or not tail.same_stream(found[0].created_at)
                    ):
                        yield StreamGone()
                        return
                    position, records = found
                    if (records and records[0].sequence != last + 1) or (
                        not records and last + 1 < position.earliest
                    ):
                        yield Overtaken(
                            requested=last + 1, earliest=position.earliest, latest=position.head
                        )
                        return
                    delivery = RecordsDelivered(records)
                if records := delivery.records:
                    if records[0].sequence != last + 1:
                        continue  # the ring moved on meanwhile: reread from the source
                    if lease is not None and lease.ended:
                        continue  # revoked while reading: said at the top, nothing delivered
                    last = records[-1].sequence
                    spoke = tail.ticks
                    if not tracing.on():
                        yield delivery
                        continue
                    # The delivery's span lasts until the follower asks for the next (its
                    # transport has written this one), linked to the appends it carries.
                    span = tracing.start(
                        "live delivery",
                        links=tracing.APPENDS.of(key, records[0].sequence, last),
                        attributes={
                            **tracing.stream_attributes(key),
                            "ductor_streams.first_sequence": records[0].sequence,
                            "ductor_streams.last_sequence": last,
                        },
                    )
                    try:
                        yield delivery
                    finally:
                        if span is not None:
                            span.end()
                    continue
                if tail.closed and last >= tail.head:
                    yield StreamEnded(head=tail.head)
                    return
                if tail.ticks - spoke >= 2:
                    spoke = tail.ticks
                    yield Idle()
                    continue
                await changed.waiter()
