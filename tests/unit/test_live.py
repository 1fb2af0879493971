"""Live delivery on the memory adapters: one tail per stream, cursor-exact fan-out."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

import msgspec
import pytest

from adapters.memory.access import MemoryStreamAccess
from adapters.memory.streams import MemoryStreams
from application.close_stream import CloseCommand
from application.definitions import Definitions
from application.delete_stream import DeleteCommand
from application.errors import NotFound, Unauthenticated
from application.expiry import AccessLog
from application.live import (
    DELIVERY_BYTES,
    SIGNAL_SLICE,
    Idle,
    LiveTails,
    Overtaken,
    RecordsDelivered,
    Revoked,
    Signal,
    StreamEnded,
    StreamGone,
)
from application.placement import Deployment
from application.read_records import ReadRecords
from application.tokens import TokenCache
from application.wake import WakeRegistry
from domain.definition import Limits
from domain.errors import CursorAheadOfHead
from domain.stream import StreamKey
from tests.support.builders import NOW, WRITER, append, definition, new_key, record


class Prune:
    idempotency = None
    records = ()
    offset_of = None
    producer = None

    def __init__(self, through: int, pruned_bytes: int) -> None:
        self.through, self.pruned_bytes = through, pruned_bytes

    def decide(self, stream, offset):
        return stream.prune(self.through, self.pruned_bytes, "retention", NOW)

    def answer(self, stream, events):
        return None


BIG = Limits(max_unread_items=10**6, max_unread_bytes=10**12)


@pytest.fixture
def live():
    wake = WakeRegistry()
    streams = MemoryStreams(wake)
    return streams, LiveTails(streams, wake, ring_records=8), wake


async def collect(deliveries, until: int, timeout: float = 5.0) -> list[int]:
    seen: list[int] = []
    async with asyncio.timeout(timeout):
        async for d in deliveries:
            if isinstance(d, RecordsDelivered):
                seen.extend(r.sequence for r in d.records)
            if isinstance(d, StreamEnded | Overtaken) or (seen and seen[-1] >= until):
                break
    return seen


async def test_a_subscriber_gets_history_then_live_records_in_order_without_duplicates(
    live,
) -> None:
    streams, tails, _ = live
    key = new_key()
    await streams.create(key, definition(), NOW)
    await streams.update(key, [append([record() for _ in range(20)])])  # more than the ring
    follower = asyncio.ensure_future(collect(tails.follow(key, 5, 1.0), until=40))
    for _ in range(20):
        await streams.update(key, [append()])
        await asyncio.sleep(0)
    assert await follower == list(range(6, 41))


async def test_many_subscribers_share_one_read_per_wake(live) -> None:
    streams, tails, _ = live
    key = new_key()
    await streams.create(key, definition(), NOW)
    followers = [
        asyncio.ensure_future(collect(tails.follow(key, 0, 1.0), until=10)) for _ in range(50)
    ]
    await asyncio.sleep(0.01)
    tail = tails.tail(key)
    assert tail is not None
    reads_before = tail.reads
    for _ in range(10):
        await streams.update(key, [append()])
        await asyncio.sleep(0.001)
    results = await asyncio.gather(*followers)
    assert all(r == list(range(1, 11)) for r in results)
    assert tail.reads - reads_before <= 10  # one read per wake, not one per subscriber
    assert tails.tail(key) is None  # the last subscriber leaving ends the tail


async def test_a_closed_stream_ends_each_subscription_after_its_last_record(live) -> None:
    streams, tails, _ = live
    key = new_key()
    await streams.create(key, definition(), NOW)
    await streams.update(key, [append([record(), record()])])
    await streams.update(key, [CloseCommand(WRITER, NOW)])
    deliveries = [d async for d in tails.follow(key, 0, 1.0)]
    assert [r.sequence for r in deliveries[0].records] == [1, 2]
    assert deliveries[-1] == StreamEnded(head=2)


async def test_an_idle_subscription_yields_heartbeats(live) -> None:
    streams, tails, _ = live
    key = new_key()
    await streams.create(key, definition(), NOW)
    follow = tails.follow(key, 0, 0.01)
    assert isinstance(await anext(follow), Idle)
    await follow.aclose()


async def test_a_subscriber_overtaken_by_retention_is_told_what_is_left(live) -> None:
    streams, tails, _ = live
    key = new_key()
    await streams.create(key, definition(), NOW)
    await streams.update(key, [append([record(b"1") for _ in range(30)])])
    await streams.update(key, [Prune(through=20, pruned_bytes=20)])
    deliveries = [d async for d in tails.follow(key, 3, 1.0)]
    assert deliveries == [Overtaken(requested=4, earliest=21, latest=30)]


async def test_a_slow_subscriber_falls_behind_the_ring_and_reads_the_source(live) -> None:
    streams, tails, _ = live
    key = new_key()
    await streams.create(key, definition(), NOW)
    follow = tails.follow(key, 0, 1.0)
    await streams.update(key, [append()])
    first = await anext(follow)
    assert [r.sequence for r in first.records] == [1]
    for _ in range(30):  # the ring holds 8: this subscriber is left far behind
        await streams.update(key, [append()])
        await asyncio.sleep(0)
    rest = await collect(follow, until=31)
    assert rest == list(range(2, 32))


async def test_ending_all_ends_every_follower_without_a_closed_event(live) -> None:
    streams, tails, _ = live
    key = new_key()
    await streams.create(key, definition(), NOW)
    await streams.update(key, [append([record() for _ in range(3)])])
    deliveries: list[list] = [[], []]

    async def follow(into: list) -> None:
        async for delivery in tails.follow(key, 0, 60.0):  # no heartbeat within the test
            into.append(delivery)

    followers = [asyncio.ensure_future(follow(d)) for d in deliveries]
    await asyncio.sleep(0.05)
    tails.end_all()
    async with asyncio.timeout(5):
        await asyncio.gather(*followers)
    for got in deliveries:
        assert [r.sequence for d in got for r in d.records] == [1, 2, 3]
        assert not any(isinstance(d, StreamEnded) for d in got)  # the stream is not closed
    assert tails.tail(key) is None


async def test_followers_at_the_same_position_share_one_delivery_encoded_once(live) -> None:
    streams, tails, _ = live
    key = new_key()
    await streams.create(key, definition(), NOW)
    follows = [tails.follow(key, 0, 60.0) for _ in range(3)]
    nexts = [asyncio.ensure_future(anext(f)) for f in follows]
    await asyncio.sleep(0.01)
    await streams.update(key, [append([record(), record()])])
    got = await asyncio.gather(*nexts)
    assert [r.sequence for r in got[0].records] == [1, 2]
    assert got[1] is got[0] and got[2] is got[0]
    encoded: list[int] = []

    def encode(records) -> bytes:
        encoded.append(len(records))
        return b"frame"

    assert [d.encoded_as(encode) for d in got] == [b"frame"] * 3
    assert encoded == [2]
    for f in follows:
        await f.aclose()


async def test_a_follower_behind_the_newest_page_gets_its_own_delivery(live) -> None:
    streams, tails, _ = live
    key = new_key()
    await streams.create(key, definition(), NOW)
    await streams.update(key, [append()])
    ahead, behind = tails.follow(key, 1, 60.0), tails.follow(key, 0, 60.0)
    waiting = asyncio.ensure_future(anext(ahead))
    await asyncio.sleep(0.01)
    await streams.update(key, [append()])
    assert [r.sequence for r in (await waiting).records] == [2]
    assert [r.sequence for r in (await anext(behind)).records] == [1, 2]
    await ahead.aclose()
    await behind.aclose()


async def test_heartbeats_come_only_after_two_quiet_ticks(live) -> None:
    streams, tails, _ = live  # the tail rereads only every 15 s: ticks alone wake followers
    key = new_key()
    await streams.create(key, definition(), NOW)
    follow = tails.follow(key, 0, 0.2)  # ticks every 0.1 s
    tail = None
    async with asyncio.timeout(5):
        assert isinstance(await anext(follow), Idle)  # after two ticks of silence
        tail = tails.tail(key)
        assert tail is not None and tail.ticks >= 2
        await asyncio.sleep(0.15)  # the delivery lands at another tick than the heartbeat
        await streams.update(key, [append()])
        assert isinstance(await anext(follow), RecordsDelivered)
        delivered_at = tail.ticks
        assert isinstance(await anext(follow), Idle)
        assert tail.ticks - delivered_at >= 2  # a delivery counts as saying something
    await follow.aclose()
    assert tails.tail(key) is None
    stopped_at = tail.ticks
    await asyncio.sleep(0.35)
    assert tail.ticks == stopped_at  # the last follower leaving stops the tail's timer


async def test_a_page_larger_than_the_ring_is_not_kept_to_share(live) -> None:
    streams, tails, _ = live  # the ring holds 8 records
    key = new_key()
    await streams.create(key, definition(), NOW)
    follows = [tails.follow(key, 0, 60.0) for _ in range(2)]
    nexts = [asyncio.ensure_future(anext(f)) for f in follows]
    await asyncio.sleep(0.01)
    await streams.update(key, [append([record() for _ in range(20)])])
    first, second = await asyncio.gather(*nexts)
    assert [r.sequence for r in first.records] == list(range(1, 21))
    assert [r.sequence for r in second.records] == list(range(1, 21))
    assert first is not second  # each read its own from the source
    for f in follows:
        await f.aclose()


async def test_a_signal_wakes_its_waiters_once_and_skips_cancelled_ones() -> None:
    signal = Signal(asyncio.get_running_loop())
    first, cancelled = signal.waiter(), signal.waiter()
    cancelled.cancel()
    signal.fire()
    assert first.done() and first.result() is None
    assert cancelled.cancelled()
    assert signal.waiter().done()  # a signal that fired stays fired


async def test_a_record_larger_than_the_ring_still_reaches_its_followers() -> None:
    wake = WakeRegistry()
    streams = MemoryStreams(wake)
    tails = LiveTails(streams, wake, ring_bytes=16)  # holds no record of 20 bytes
    key = new_key()
    await streams.create(key, definition(), NOW)
    follow = tails.follow(key, 0, 60.0)
    waiting = asyncio.ensure_future(anext(follow))
    await asyncio.sleep(0.01)
    await streams.update(key, [append([record(b'"' + b"x" * 18 + b'"')])])
    async with asyncio.timeout(5):
        delivered = await waiting
    assert [r.sequence for r in delivered.records] == [1]
    await follow.aclose()


async def test_closing_a_stream_ends_a_follower_waiting_at_its_head(live) -> None:
    streams, tails, _ = live
    key = new_key()
    await streams.create(key, definition(), NOW)
    follow = tails.follow(key, 0, 60.0)
    waiting = asyncio.ensure_future(anext(follow))
    await asyncio.sleep(0.01)
    await streams.update(key, [append()])  # through the tail's ring
    async with asyncio.timeout(5):
        assert [r.sequence for r in (await waiting).records] == [1]
        waiting = asyncio.ensure_future(anext(follow))
        await asyncio.sleep(0.01)
        await streams.update(key, [CloseCommand(WRITER, NOW)])  # a wake with no new record
        assert await waiting == StreamEnded(head=1)
    await follow.aclose()


async def test_a_deleted_stream_ends_every_follower_and_a_long_poll(live) -> None:
    streams, tails, wake = live
    key = new_key()
    await streams.create(key, definition(), NOW)
    await streams.update(key, [append([record() for _ in range(3)])])

    async def last_delivery(cursor: int) -> object:
        async with asyncio.timeout(5):
            async for delivery in tails.follow(key, cursor, 1.0):
                last = delivery
        return last

    followers = [asyncio.ensure_future(last_delivery(c)) for c in (0, 3)]
    access = AccessLog(MemoryStreamAccess(streams), lambda: NOW)
    reads = ReadRecords(Definitions(streams, Deployment("local", "local"), access), streams, wake)
    poll = asyncio.ensure_future(reads(WRITER, key.run_id, key.stream_id, cursor=3, wait=5))
    await asyncio.sleep(0.05)
    await streams.update(key, [DeleteCommand(NOW)])
    assert [await f for f in followers] == [StreamGone(), StreamGone()]
    with pytest.raises(NotFound):
        await poll
    assert tails.tail(key) is None
    # Created again: a new tail follows the new stream from its start.
    await streams.create(key, definition(), NOW)
    follower = asyncio.ensure_future(collect(tails.follow(key, 0, 1.0), until=2))
    await asyncio.sleep(0.01)
    await streams.update(key, [append(), append()])
    assert await follower == [1, 2]


async def test_a_stream_created_again_gets_a_new_tail_while_the_old_one_winds_down(live) -> None:
    streams, tails, _ = live
    key = new_key()
    await streams.create(key, definition(), NOW)
    await streams.update(key, [append()])
    old_follow = tails.follow(key, 0, 1.0)
    assert isinstance(await anext(old_follow), RecordsDelivered)  # suspended, still joined
    old = tails.tail(key)
    await streams.update(key, [DeleteCommand(NOW)])
    await asyncio.sleep(0.01)
    await streams.create(key, definition(), NOW)
    follower = asyncio.ensure_future(collect(tails.follow(key, 0, 1.0), until=1))
    await asyncio.sleep(0.01)
    assert tails.tail(key) is not old
    await streams.update(key, [append()])
    assert await follower == [1]
    assert await anext(old_follow) == StreamGone()
    await old_follow.aclose()
    assert old._ticker is not None and old._ticker.cancelled()  # stopped, though replaced


async def test_a_revoked_token_ends_its_followers_and_long_poll_before_the_next_record(
    live,
) -> None:
    streams, tails, wake = live
    key = new_key()
    await streams.create(key, definition(), NOW)
    await streams.update(key, [append()])
    cache = TokenCache()
    doomed = msgspec.structs.replace(WRITER, token_id="tok_doomed")
    kept = msgspec.structs.replace(WRITER, token_id="tok_kept")

    async def deliveries(caller) -> list[object]:
        lease = cache.hold(caller)
        seen = []
        try:
            async with asyncio.timeout(5):
                async for delivery in tails.follow(key, 0, 60.0, lease):
                    seen.append(delivery)
                    if isinstance(delivery, Revoked) or (
                        isinstance(delivery, RecordsDelivered)
                        and delivery.records[-1].sequence == 2
                    ):
                        return seen
        finally:
            cache.release(lease)
        return seen

    followers = [asyncio.ensure_future(deliveries(c)) for c in (doomed, doomed, kept)]
    access = AccessLog(MemoryStreamAccess(streams), lambda: NOW)
    definitions = Definitions(streams, Deployment("local", "local"), access)
    reads = ReadRecords(definitions, streams, wake, cache)
    poll = asyncio.ensure_future(reads(doomed, key.run_id, key.stream_id, cursor=1, wait=30))
    await asyncio.sleep(0.05)
    assert not poll.done()
    cache.forget("tok_doomed")  # as the wake bus does when it hears the revocation
    with pytest.raises(Unauthenticated):
        async with asyncio.timeout(1):
            await poll
    await asyncio.sleep(0.01)
    await streams.update(key, [append()])
    first, second, other = [await f for f in followers]
    for revoked in (first, second):
        assert [type(d) for d in revoked] == [RecordsDelivered, Revoked]
        assert revoked[0].records[-1].sequence == 1
    assert [d.records[-1].sequence for d in other] == [1, 2]
    assert cache.held() == 0


class FailingReader:
    """The memory store, with reads that fail while `failing` (a database out of reach)."""

    def __init__(self, streams: MemoryStreams) -> None:
        self._streams = streams
        self.failing = False
        self.failed = 0

    async def page(self, *args, **kwargs):
        if self.failing:
            self.failed += 1
            raise ConnectionRefusedError("the database is out of reach")
        return await self._streams.page(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._streams, name)


async def failing_tails(
    retry_max_seconds: float,
) -> tuple[MemoryStreams, FailingReader, LiveTails, StreamKey]:
    """A stream on the memory adapter, read through a reader that fails when told to, and the
    tails that follow it (retrying from 10 ms up to `retry_max_seconds`)."""
    wake = WakeRegistry()
    streams = MemoryStreams(wake)
    reader = FailingReader(streams)
    tails = LiveTails(reader, wake, retry_first_seconds=0.01, retry_max_seconds=retry_max_seconds)
    key = new_key()
    await streams.create(key, definition(), NOW)
    return streams, reader, tails, key


async def test_a_tail_that_cannot_read_backs_off_says_so_once_and_delivers_once_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    streams, reader, tails, key = await failing_tails(retry_max_seconds=0.08)
    follower = asyncio.ensure_future(collect(tails.follow(key, 0, 60.0), until=3))
    tail = None
    while tail is None or not tail.ready.is_set():
        await asyncio.sleep(0.001)
        tail = tails.tail(key)
    caplog.set_level("WARNING", logger="ductor_streams.live")
    reader.failing = True
    await streams.update(key, [append(), append()])  # its wake makes the tail read, and fail
    await asyncio.sleep(0.5)
    # Backing off: pauses doubling from 10 ms to 80 ms (jittered down to half), not a retry
    # per loop turn; and bounded: still trying.
    assert 4 <= reader.failed <= 20, reader.failed
    assert tails.outages.open and tails.outages.failing == {key}
    assert not follower.done()
    reader.failing = False
    await asyncio.sleep(0.2)  # within the bound, the tail reads again and delivers
    await streams.update(key, [append()])
    assert await follower == [1, 2, 3]
    assert (tails.outages.episodes, tails.outages.open) == (1, False)
    assert tails.outages.failures == reader.failed
    said = [r.getMessage() for r in caplog.records if r.name == "ductor_streams.live"]
    assert len(said) == 2, said
    assert said[0].startswith("live delivery cannot read") and "ConnectionRefusedError" in said[0]
    assert said[1].startswith("live delivery reads again after")


async def test_a_tail_stopped_while_failing_leaves_the_outage_to_the_next_read() -> None:
    streams, reader, tails, key = await failing_tails(retry_max_seconds=0.02)
    reader.failing = True
    follower = asyncio.ensure_future(collect(tails.follow(key, 0, 60.0), until=1))
    await asyncio.sleep(0.05)
    follower.cancel()
    with pytest.raises(asyncio.CancelledError):
        await follower
    assert tails.outages.open and tails.outages.failing == set()
    reader.failing = False
    await streams.update(key, [append()])
    assert await collect(tails.follow(key, 0, 60.0), until=1) == [1]
    assert not tails.outages.open and tails.outages.episodes == 1


async def test_a_follower_hears_heartbeats_while_its_tails_first_read_keeps_failing() -> None:
    """The database out of reach before the tail first read: the follower is not silent for the
    whole outage (a proxy would time the connection out), it hears a heartbeat each interval,
    then its records once the tail reads."""
    streams, reader, tails, key = await failing_tails(retry_max_seconds=0.02)
    await streams.update(key, [append()])
    reader.failing = True
    follow = tails.follow(key, 0, 0.05)
    async with asyncio.timeout(2):
        assert isinstance(await anext(follow), Idle)
        assert isinstance(await anext(follow), Idle)
    reader.failing = False
    async with asyncio.timeout(2):
        while isinstance(delivered := await anext(follow), Idle):
            pass
    assert isinstance(delivered, RecordsDelivered)
    assert [r.sequence for r in delivered.records] == [1]
    await follow.aclose()


@pytest.mark.parametrize("skew", [1, -1], ids=["later", "earlier"])
async def test_a_stream_created_again_elsewhere_never_gets_the_old_tails_records(
    live, skew: int
) -> None:
    """Deleted and created again by another process, whose deletion this one has not heard
    yet: a follower checked against the new stream is not served the old tail's ring (the old
    stream's records), it gets a new tail; the old tail's followers are told it is gone. The
    creation times come from the creating processes' clocks: the new one may be the earlier."""
    from datetime import timedelta

    streams, tails, wake = live
    key = new_key()
    await streams.create(key, definition(), NOW)
    await streams.update(key, [append([record(b'{"old":1}') for _ in range(3)])])
    old_follow = tails.follow(key, 0, 1.0)
    assert isinstance(await anext(old_follow), RecordsDelivered)  # the ring holds 1..3
    heard = wake.notify_deleted
    wake.notify_deleted = lambda k: None  # the deletion is not heard here (yet)
    await streams.update(key, [DeleteCommand(NOW)])
    wake.notify_deleted = heard
    later = NOW + timedelta(seconds=skew)
    await streams.create(key, definition(), later)
    await streams.update(key, [append([record(b'{"new":1}')])])
    new_follow = tails.follow(key, 0, 1.0, created_at=later)
    async with asyncio.timeout(2):
        delivered = await anext(new_follow)
    assert isinstance(delivered, RecordsDelivered)
    assert [r.payload for r in delivered.records] == [b'{"new":1}']
    assert await anext(old_follow) == StreamGone()
    # A follower checked against the old stream, joining the new one's tail, is told it is gone.
    stale = tails.follow(key, 0, 1.0, created_at=NOW)
    assert await anext(stale) == StreamGone()
    for follow in (old_follow, new_follow, stale):
        await follow.aclose()


async def test_a_deletion_heard_late_of_an_earlier_stream_does_not_end_its_successor(
    live,
) -> None:
    """The deletion notification names no incarnation: heard after the stream was created again
    (and followed), it is of the earlier one, and the followers of the new one go on."""
    streams, tails, wake = live
    key = new_key()
    await streams.create(key, definition(), NOW)
    follow = tails.follow(key, 0, 1.0)
    waiting = asyncio.ensure_future(anext(follow))
    await asyncio.sleep(0.01)
    wake.notify_deleted(key)  # an earlier incarnation's deletion, heard late
    await asyncio.sleep(0.01)
    await streams.update(key, [append()])
    async with asyncio.timeout(2):
        delivered = await waiting
    assert isinstance(delivered, RecordsDelivered), delivered
    assert [r.sequence for r in delivered.records] == [1]
    await follow.aclose()


async def test_a_follower_behind_the_ring_reads_large_records_a_delivery_at_a_time() -> None:
    """A delivery made for one follower holds at most DELIVERY_BYTES of payload (and at least
    one record), and so does each of its reads of the source: nothing more of the source is
    held while its client takes the delivery."""
    wake = WakeRegistry()
    streams = MemoryStreams(wake)
    reads: list[tuple[int, int | None, int]] = []

    class Counting:
        async def page(self, key, cursor, limit, max_bytes=None):
            found = await streams.page(key, cursor, limit, max_bytes)
            assert found is not None
            reads.append((limit, max_bytes, sum(len(r.payload) for r in found[1])))
            return found

        def __getattr__(self, name):
            return getattr(streams, name)

    tails = LiveTails(Counting(), wake, ring_records=8)  # type: ignore[arg-type]
    key = new_key()
    await streams.create(key, msgspec.structs.replace(definition(), limits=BIG), NOW)
    big = b"x" * 60_000
    for _ in range(5):
        await streams.update(key, [append([record(big)] * 40)])  # 200 records of 60 KB
    follow = tails.follow(key, 0, 1.0)
    seen = 0
    async with asyncio.timeout(5):
        async for delivery in follow:
            if isinstance(delivery, RecordsDelivered):
                assert delivery.records[0].sequence == seen + 1
                assert sum(len(r.payload) for r in delivery.records) <= DELIVERY_BYTES
                seen = delivery.records[-1].sequence
                if seen == 200:
                    break
    await follow.aclose()
    # The follower's reads (beside the tail's own: its first position, then its ring's bytes).
    mine = [read for read in reads if read[1] == DELIVERY_BYTES]
    assert len(mine) >= 200 * 60_000 // DELIVERY_BYTES
    assert all(size <= DELIVERY_BYTES for _, _, size in mine), mine


async def test_native_waiting_reads_of_one_stream_read_each_append_once(live) -> None:
    """However many native reads wait on a stream, an append is read once for all of them
    (the shared tail), not once per waiter: 9,900 waiters woken together were 9,900 reads."""
    streams, _, wake = live
    reads: list[int] = []

    class Counting:
        async def page(self, key, cursor, limit, max_bytes=None):
            reads.append(cursor)
            return await streams.page(key, cursor, limit, max_bytes)

        def __getattr__(self, name):
            return getattr(streams, name)

    reader = Counting()
    tails = LiveTails(reader, wake)  # type: ignore[arg-type]
    access = AccessLog(MemoryStreamAccess(streams), lambda: NOW)
    definitions = Definitions(streams, Deployment("local", "local"), access)
    reads_records = ReadRecords(definitions, reader, wake, tails=tails)  # type: ignore[arg-type]
    key = new_key()
    await streams.create(key, definition(), NOW)
    await streams.update(key, [append()])
    waiting = [
        asyncio.ensure_future(
            reads_records.stored(WRITER, key.run_id, key.stream_id, cursor=1, limit=10, wait=30)
        )
        for _ in range(50)
    ]
    await asyncio.sleep(0.05)
    assert not any(w.done() for w in waiting)
    before = len(reads)
    await streams.update(key, [append([record(b"2"), record(b"3")])])
    async with asyncio.timeout(5):
        pages = await asyncio.gather(*waiting)
    assert len(reads) - before <= 2  # the tail's read (and at most one more), not 50
    for page in pages:
        assert [r.sequence for r in page.records] == [2, 3]
        assert (page.next_cursor, page.head, page.closed) == (3, 3, False)
    assert tails.tail(key) is None  # the last waiter left: the tail stopped

    # While the tail is followed, a waiting read at the tail's position reads nothing to learn
    # that it must wait.
    follower = tails.follow(key, 3, 60.0)
    held = asyncio.ensure_future(anext(follower))
    await asyncio.sleep(0.05)
    before = len(reads)
    waiting = [
        asyncio.ensure_future(
            reads_records.stored(WRITER, key.run_id, key.stream_id, cursor=3, limit=10, wait=30)
        )
        for _ in range(50)
    ]
    await asyncio.sleep(0.05)
    assert len(reads) == before and not any(w.done() for w in waiting)
    await streams.update(key, [append([record(b"4")])])
    async with asyncio.timeout(5):
        pages = await asyncio.gather(*waiting)
        assert (await held).records[-1].sequence == 4
    assert [[r.sequence for r in p.records] for p in pages] == [[4]] * 50
    assert len(reads) - before <= 1  # the tail's
    # Records are read from the database, never answered from the ring (a tail is a
    # notification behind); a cursor beyond what the tail has read is read too (the database
    # says it is ahead).
    before = len(reads)
    page = await reads_records.stored(WRITER, key.run_id, key.stream_id, cursor=2, wait=30)
    assert ([r.sequence for r in page.records], page.head) == ([3, 4], 4)
    with pytest.raises(CursorAheadOfHead):
        await reads_records.stored(WRITER, key.run_id, key.stream_id, cursor=9, wait=30)
    assert len(reads) == before + 2
    await follower.aclose()


async def test_a_native_waiting_read_answers_within_its_limit_and_at_its_deadline(live) -> None:
    streams, tails, wake = live
    access = AccessLog(MemoryStreamAccess(streams), lambda: NOW)
    definitions = Definitions(streams, Deployment("local", "local"), access)
    reads = ReadRecords(definitions, streams, wake, tails=tails)
    key = new_key()
    await streams.create(key, definition(), NOW)
    poll = asyncio.ensure_future(
        reads.stored(WRITER, key.run_id, key.stream_id, cursor=0, limit=2, wait=30)
    )
    await asyncio.sleep(0.05)
    await streams.update(key, [append([record(b"1"), record(b"2"), record(b"3")])])
    async with asyncio.timeout(5):
        page = await poll
    assert [r.sequence for r in page.records] == [1, 2]
    assert (page.next_cursor, page.head) == (2, 3)
    # Nothing comes: the empty page at the deadline, with the position the tail read.
    page = await reads.stored(WRITER, key.run_id, key.stream_id, cursor=3, wait=0.1)
    assert (page.records, page.next_cursor, page.head, page.closed) == ([], 3, 3, False)
    # Closed while waiting: answered at once, closed.
    poll = asyncio.ensure_future(reads.stored(WRITER, key.run_id, key.stream_id, 3, wait=30))
    await asyncio.sleep(0.05)
    await streams.update(key, [CloseCommand(WRITER, NOW)])
    async with asyncio.timeout(5):
        page = await poll
    assert (page.records, page.next_cursor, page.head, page.closed) == ([], 3, 3, True)


async def test_a_tail_lingers_after_its_last_follower_and_is_taken_up_again() -> None:
    wake = WakeRegistry()
    streams = MemoryStreams(wake)
    tails = LiveTails(streams, wake, linger_seconds=0.2)
    key = new_key()

    async def followed(cursor: int, until: int) -> list[int]:
        async with contextlib.aclosing(tails.follow(key, cursor, 60.0)) as follow:
            return await collect(follow, until=until)

    await streams.create(key, definition(), NOW)
    await streams.update(key, [append()])
    assert await followed(0, until=1) == [1]
    tail = tails.tail(key)
    assert tail is not None and tail.subscribers == 0  # lingering, its position known
    assert tail.position == 1
    await streams.update(key, [append()])
    await asyncio.sleep(0.05)
    assert tail.position == 2  # it still reads what is appended
    # Followed again within the linger: the same tail, kept past the first linger's end.
    follower = asyncio.ensure_future(followed(2, until=3))
    await asyncio.sleep(0.3)
    assert tails.tail(key) is tail
    await streams.update(key, [append()])
    assert await follower == [3]
    await asyncio.sleep(0.3)
    assert tails.tail(key) is None  # no follower for the linger: stopped
    assert tail._task is not None and tail._task.done()
    # Stopping the process stops the lingering tails at once.
    assert await followed(2, until=3) == [3]
    lingering = tails.tail(key)
    assert lingering is not None
    tails.end_all()
    assert tails.tail(key) is None
    await asyncio.sleep(0.01)
    assert lingering._task is not None and lingering._task.done()


async def test_a_signal_wakes_its_waiters_a_slice_per_turn_of_the_loop() -> None:
    signal = Signal(asyncio.get_running_loop())
    waiters = [signal.waiter() for _ in range(2 * SIGNAL_SLICE + 100)]
    waiters[0].cancel()  # skipped: it does not count in the slice
    signal.fire()
    assert sum(w.done() and not w.cancelled() for w in waiters) == SIGNAL_SLICE
    await asyncio.sleep(0)  # another turn: another request's step could run here
    assert sum(w.done() and not w.cancelled() for w in waiters) == 2 * SIGNAL_SLICE
    await asyncio.sleep(0)
    assert all(w.done() for w in waiters)
    assert signal.waiter().done()  # fired: a later waiter is done at once


def _two_processes(linger: float = 5.0):
    """Process A writes (its wake registry hears at once); process B serves the reads and hears
    A's notifications only when the test forwards them (a notification's latency, or another
    `--workers` process)."""
    wake_a = WakeRegistry()
    streams = MemoryStreams(wake_a)
    wake_b = WakeRegistry()
    tails = LiveTails(streams, wake_b, linger_seconds=linger)
    access = AccessLog(MemoryStreamAccess(streams), lambda: NOW)
    definitions = Definitions(streams, Deployment("local", "local"), access)
    reads = ReadRecords(definitions, streams, wake_b, tails=tails)
    return streams, wake_b, tails, reads


async def _old_incarnation_followed(streams, wake_b, reads, key) -> None:
    await streams.create(key, definition(), NOW)
    poll = asyncio.ensure_future(
        reads.stored(WRITER, key.run_id, key.stream_id, cursor=0, limit=10, wait=30)
    )
    await asyncio.sleep(0.05)
    await streams.update(key, [append([record(b'"old-1"'), record(b'"old-2"')])])
    wake_b.notify(key)
    async with asyncio.timeout(5):
        page = await poll
    assert [r.payload for r in page.records] == [b'"old-1"', b'"old-2"']
    # Deleted and created again (by process A); B's lingering tail has not heard yet.
    await streams.update(key, [DeleteCommand(NOW)])
    await streams.create(key, definition(), NOW + timedelta(seconds=1))
    await streams.update(key, [append([record(b'"new-1"')])])


async def test_a_waiting_read_after_delete_and_recreate_not_heard_gets_the_new_streams_records():
    streams, wake_b, tails, reads = _two_processes()
    key = new_key()
    await _old_incarnation_followed(streams, wake_b, reads, key)
    page = await reads.stored(WRITER, key.run_id, key.stream_id, cursor=0, limit=10, wait=5)
    # Read from the database, not the old stream's ring: the new stream's one record.
    assert [r.payload for r in page.records] == [b'"new-1"'], page
    tails.end_all()


async def test_a_wait_on_a_tail_that_had_not_heard_of_a_recreation_answers_404():
    streams, wake_b, tails, reads = _two_processes()
    key = new_key()
    await _old_incarnation_followed(streams, wake_b, reads, key)
    # cursor 2 is ahead of the new stream's head (1): before, 400 cursor-ahead-of-head at once.
    poll = asyncio.ensure_future(
        reads.stored(WRITER, key.run_id, key.stream_id, cursor=2, limit=10, wait=5)
    )
    await asyncio.sleep(0.05)
    assert not poll.done()  # it waits on the old incarnation's tail (at its position) ...
    wake_b.notify_deleted(key)  # ... until this process hears of the deletion
    with pytest.raises(NotFound):  # deleted a moment before: as if deleted while it waited
        async with asyncio.timeout(5):
            await poll
    tails.end_all()


async def test_a_short_native_wait_does_not_shorten_the_tails_heartbeats() -> None:
    """A tail's ticks never lengthen again: a native read's short wait must not make every
    follower of the stream (an SSE subscriber with its 15 s heartbeat) hear heartbeats every
    second for as long as the tail lives."""
    wake = WakeRegistry()
    streams = MemoryStreams(wake)
    tails = LiveTails(streams, wake, linger_seconds=5.0)
    access = AccessLog(MemoryStreamAccess(streams), lambda: NOW)
    definitions = Definitions(streams, Deployment("local", "local"), access)
    reads = ReadRecords(definitions, streams, wake, tails=tails)
    key = new_key()
    await streams.create(key, definition(), NOW)
    idles = 0

    async def subscriber() -> None:  # an SSE subscriber, heartbeat 15 s
        nonlocal idles
        async with contextlib.aclosing(tails.follow(key, 0, 15.0)) as follow:
            async for delivery in follow:
                if isinstance(delivery, Idle):
                    idles += 1

    sse = asyncio.ensure_future(subscriber())
    await asyncio.sleep(0.05)
    await reads.stored(WRITER, key.run_id, key.stream_id, cursor=0, wait=0.001)
    await asyncio.sleep(2.6)
    sse.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sse
    tails.end_all()
    assert idles == 0, f"{idles} heartbeats in 2.6 s for a 15 s heartbeat"


async def test_a_wait_whose_first_read_outlasts_it_does_not_make_the_tail_spin() -> None:
    """The wait's deadline is set before its first read; a read slower than the wait (the
    pool busy) once gave the tail a heartbeat of zero or less: a tick every turn of the loop."""
    wake = WakeRegistry()
    streams = MemoryStreams(wake)
    slow = [True]

    class Slow:
        async def page(self, key, cursor, limit, max_bytes=None):
            if slow[0]:
                slow[0] = False
                await asyncio.sleep(1.2)
            return await streams.page(key, cursor, limit, max_bytes)

        def __getattr__(self, name):
            return getattr(streams, name)

    reader = Slow()
    tails = LiveTails(reader, wake, linger_seconds=5.0)  # type: ignore[arg-type]
    access = AccessLog(MemoryStreamAccess(streams), lambda: NOW)
    definitions = Definitions(streams, Deployment("local", "local"), access)
    reads = ReadRecords(definitions, reader, wake, tails=tails)  # type: ignore[arg-type]
    key = new_key()
    await streams.create(key, definition(), NOW)
    await reads.stored(WRITER, key.run_id, key.stream_id, cursor=0, wait=0.1)
    tail = tails.tail(key)
    assert tail is not None  # lingering
    before = tail.ticks
    await asyncio.sleep(0.1)
    ticks = tail.ticks - before
    tails.end_all()
    assert ticks < 10, f"the lingering tail ticked {ticks} times in 0.1 s"


def _one_process():
    wake = WakeRegistry()
    streams = MemoryStreams(wake)
    tails = LiveTails(streams, wake, linger_seconds=5.0)
    access = AccessLog(MemoryStreamAccess(streams), lambda: NOW)
    definitions = Definitions(streams, Deployment("local", "local"), access)
    return streams, tails, ReadRecords(definitions, streams, wake, tails=tails)


async def _recreated_while_waiting(with_other_follower: bool):
    streams, tails, reads = _one_process()
    key = new_key()
    await streams.create(key, definition(), NOW)
    await streams.update(key, [append([record(b'"old-1"'), record(b'"old-2"')])])
    other = None
    if with_other_follower:  # another client (an SSE subscriber) keeps the stream's tail

        async def follow() -> None:
            async with contextlib.aclosing(tails.follow(key, 2, 15.0)) as f:
                async for _ in f:
                    pass

        other = asyncio.ensure_future(follow())
        await asyncio.sleep(0.05)
        assert tails.tail(key).position == 2
    poll = asyncio.ensure_future(
        reads.stored(WRITER, key.run_id, key.stream_id, cursor=2, limit=10, wait=5)
    )
    await asyncio.sleep(0.05)
    assert not poll.done()  # waits on the old stream, this process up to date
    # Deleted and created again while it waits (heard at once: one process).
    await streams.update(key, [DeleteCommand(NOW)])
    await streams.create(key, definition(), NOW + timedelta(seconds=1))
    await streams.update(key, [append([record(b'"new-%d"' % i) for i in range(1, 5)])])
    try:
        async with asyncio.timeout(5):
            return await poll
    finally:
        if other is not None:
            other.cancel()
        tails.end_all()


async def test_recreated_while_waiting_without_a_tail_is_404() -> None:
    with pytest.raises(NotFound):
        await _recreated_while_waiting(with_other_follower=False)


async def test_recreated_while_waiting_is_404_whether_or_not_another_client_kept_a_tail() -> None:
    # Never the new stream's records after cursor 2, as if they continued the old stream.
    with pytest.raises(NotFound):
        page = await _recreated_while_waiting(with_other_follower=True)
        pytest.fail(f"answered {[r.payload for r in page.records]} from the new stream")


async def test_at_most_so_many_tails_linger_the_longest_lingering_retires_first() -> None:
    """Short polls over many streams: each stream's tail would linger for its 5 s (a task, a
    listener and a ring each); past the cap, the tail that has lingered longest stops."""
    wake = WakeRegistry()
    streams = MemoryStreams(wake)
    tails = LiveTails(streams, wake, linger_seconds=60.0, max_lingering=3)
    keys = [new_key() for _ in range(5)]
    for key in keys:
        await streams.create(key, definition(), NOW)
        await streams.update(key, [append()])
    stopped = []
    for key in keys:
        async with contextlib.aclosing(tails.follow(key, 0, 60.0)) as follow:
            assert await collect(follow, until=1) == [1]
        stopped.append(tails.tail(key))
    await asyncio.sleep(0.01)
    assert [tails.tail(key) is not None for key in keys] == [False, False, True, True, True]
    assert all(t is not None and t._task is not None and t._task.done() for t in stopped[:2])
    # Followed again, a lingering tail is no longer lingering: it does not count.
    async with contextlib.aclosing(tails.follow(keys[2], 1, 60.0)) as follow:
        await streams.update(keys[2], [append()])
        assert await collect(follow, until=2) == [2]
        assert [tails.tail(key) is not None for key in keys[2:]] == [True, True, True]
    tails.end_all()
