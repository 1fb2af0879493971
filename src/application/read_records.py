"""Read records after an exclusive cursor, optionally waiting for the next append."""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import datetime
from typing import NoReturn

from application import tracing
from application.access import Caller, require_reader
from application.definitions import Definitions
from application.errors import NotFound, Unauthenticated
from application.live import (
    LiveTails,
    Overtaken,
    RecordsDelivered,
    Revoked,
    StreamEnded,
    StreamGone,
)
from application.live_slots import LiveSlots
from application.ports import Position, RecordReader, StoredRecord, within_bytes
from application.tokens import Lease, TokenCache
from application.views import RecordsPage, StoredPage
from application.waiting import back_to_work
from application.wake import WakeRegistry
from domain import errors
from domain.definition import MAX_SEQUENCE
from domain.stream import StreamKey

MAX_LIMIT = 1_000
MAX_WAIT_SECONDS = 60
# A page stops before the record that would take its payloads past this many bytes (one record
# is always answered; the client reads on from `next_cursor`): 1,000 records of 64 KiB would
# otherwise be a 64 MB read and an 87 MB answer, built on the event loop every other request
# shares.
PAGE_BYTES = 4 * 1024 * 1024


class ReadRecords:
    def __init__(
        self,
        definitions: Definitions,
        reader: RecordReader,
        wake: WakeRegistry,
        tokens: TokenCache | None = None,
        slots: LiveSlots | None = None,
        tails: LiveTails | None = None,
    ) -> None:
        self._definitions = definitions
        # A read that waits follows the process's shared tail of its stream.
        self._tails = tails or LiveTails(reader, wake)
        # A read that waits holds one of its principal's live-connection slots while it waits.
        self._slots = slots or LiveSlots(1_000)
        # A waiting read is refused (401) once its token is revoked or expires meanwhile.
        self._tokens = tokens or TokenCache()
        self._reader = reader

    async def __call__(
        self,
        caller: Caller,
        run_id: str,
        stream_id: str,
        cursor: int = 0,
        limit: int = 100,
        wait: float = 0,
    ) -> RecordsPage:
        page = await self.stored(caller, run_id, stream_id, cursor, limit, wait)
        return page.view()

    @tracing.use_case("read records")
    async def stored(
        self,
        caller: Caller,
        run_id: str,
        stream_id: str,
        cursor: int = 0,
        limit: int = 100,
        wait: float = 0,
    ) -> StoredPage:
        """What `__call__` answers, its records as read (`StoredPage.json()` encodes it
        without building a view per record)."""
        caller.require("streams:read")
        key = caller.key(run_id, stream_id)
        if not 0 <= cursor <= MAX_SEQUENCE:
            raise errors.InvalidInput(f"cursor must be 0 to {MAX_SEQUENCE}", field="cursor")
        if not 1 <= limit <= MAX_LIMIT:
            raise errors.InvalidInput(f"limit must be 1 to {MAX_LIMIT}", field="limit")
        if not 0 <= wait <= MAX_WAIT_SECONDS:
            raise errors.InvalidInput(f"wait must be 0 to {MAX_WAIT_SECONDS} seconds", field="wait")
        definition = await self._definitions.get(key, delivers_data=True, runs=caller.runs)
        require_reader(caller, definition)
        if wait <= 0:
            page = await self._page(key, cursor, limit, wait_more=False)
            assert isinstance(page, StoredPage)
            return page
        deadline = time.monotonic() + wait
        lease = self._tokens.hold(caller)
        try:
            with self._definitions.access.kept_open(key, definition):
                return await self._wait(caller, key, cursor, limit, deadline, lease)
        finally:
            self._tokens.release(lease)

    async def _wait(
        self,
        caller: Caller,
        key: StreamKey,
        cursor: int,
        limit: int,
        deadline: float,
        lease: Lease,
    ) -> StoredPage:
        """The first non-empty page (or the empty one at the deadline), waited for on the
        process's shared tail of the stream (`LiveTails`): however many clients wait on a
        stream, each append is read from the database once per process, not once per waiter
        (9,900 waiting reads woken together were 9,900 reads, and another tenant's requests
        waited seconds behind them). Only a read that has to wait takes a slot: one answered at
        once holds no connection open, so it is never refused for the cap. The slot is given
        back however the wait ends (records, the deadline, an error, or the request
        cancelled)."""
        page: StoredPage | datetime | None = self._known(key, cursor)
        if page is None:
            page = await self._page(key, cursor, limit, wait_more=True)
        if lease.ended:
            raise Unauthenticated("unknown, revoked or expired token")
        if isinstance(page, StoredPage):
            return page
        # Which stream of this key the cursor was checked against: one deleted and created
        # again meanwhile is another stream, never waited on.
        created_at = page
        slot = self._slots.admit(caller)  # 429 past the cap, before waiting
        try:
            page = await self._follow(key, cursor, limit, deadline, lease, created_at)
        finally:
            self._slots.release(caller, slot)
        await back_to_work()  # (application/waiting.py, "Turns at work")
        return page

    async def _follow(
        self,
        key: StreamKey,
        cursor: int,
        limit: int,
        deadline: float,
        lease: Lease,
        created_at: datetime | None,
    ) -> StoredPage:
        """The first page the stream's tail delivers after `cursor`, or the empty one at the
        deadline. The stream deleted meanwhile (or, waited on at the tail's word, a moment
        before: the tail had not heard yet): 404, 410 if forks still read it, whether or not
        another was created under its key since."""
        remaining = deadline - time.monotonic()
        # A heartbeat longer than any wait: this follower never needs one, and it never
        # shortens the tail's ticks for the followers that do (nor makes them none at all,
        # after a first read slower than a short wait).
        follow = self._tails.follow(key, cursor, MAX_WAIT_SECONDS + 1, lease, created_at)
        async with contextlib.aclosing(follow):
            timeout = asyncio.timeout(remaining)
            try:
                async with timeout:
                    async for delivery in follow:
                        match delivery:
                            case RecordsDelivered(records=records):
                                return self._delivered(key, records, limit)
                            case StreamEnded(head=head):
                                tail = self._tails.tail(key)
                                earliest = tail.earliest if tail is not None else 1
                                return StoredPage([], cursor, head, earliest, closed=True)
                            case Overtaken() as passed:
                                raise overtaken(passed)
                            case StreamGone():
                                break
                            case Revoked():
                                raise Unauthenticated("unknown, revoked or expired token")
            except TimeoutError:
                # The wait's own deadline: nothing came. Any other timeout (the database
                # did not answer within its bound: `Unanswered`) is an outage.
                if not timeout.expired():
                    raise
                return await self._up_to_date(key, cursor, limit, created_at)
        await gone(self._reader, key)

    def _known(self, key: StreamKey, cursor: int) -> datetime | None:
        """Whether a waiting read must wait, from the stream's tail when this process follows
        it: its cursor is where the tail has read up to (the incarnation to wait on), without
        reading the database; None when the tail cannot tell (read). A first answer's records
        are always read from the database, never from the ring: a tail is a notification
        behind, and a stream deleted and created again, or pruned, meanwhile would be answered
        from what is no longer there. A read that waits is woken by what the tail reads next
        (each of its reads checks it is still the tail's stream); if its stream was deleted
        meanwhile, or a moment before, it answers 404, as a read deleted while it waited always
        has. A cursor beyond what the tail has read is read: the database says whether it is
        ahead of the head."""
        tail = self._tails.tail(key)
        if (
            tail is None
            or tail.deleted
            or not tail.ready.is_set()
            or tail.created_at is None
            or cursor != tail.position
            or cursor + 1 < tail.earliest
            or tail.closed  # the read says whether everything up to the head was delivered
        ):
            return None
        return tail.created_at

    def _delivered(self, key: StreamKey, records: list[StoredRecord], limit: int) -> StoredPage:
        """The page a wait answers from a delivery of the tail: at most `limit` records and
        `PAGE_BYTES` of payloads (a delivery is shared with other followers: never modified),
        with the position the tail last read."""
        records = within_bytes(records[:limit], PAGE_BYTES)
        last = records[-1].sequence
        tail = self._tails.tail(key)
        head = max(tail.head, last) if tail is not None else last
        return StoredPage(
            records=records,
            next_cursor=last,
            head=head,
            earliest=tail.earliest if tail is not None else records[0].sequence,
            closed=tail is not None and tail.closed and last >= tail.head,
        )

    async def _up_to_date(
        self, key: StreamKey, cursor: int, limit: int, created_at: datetime | None
    ) -> StoredPage:
        """The empty page at the deadline, with the position the tail last read (still joined:
        no read of its own); read when the tail has not read yet (the database was out of
        reach)."""
        tail = self._tails.tail(key)
        if tail is None or not tail.ready.is_set() or tail.created_at != created_at:
            page = await self._page(key, cursor, limit, wait_more=False)
            assert isinstance(page, StoredPage)
            return page
        check_cursor(cursor, max(tail.head, cursor), tail.earliest)
        return StoredPage([], cursor, max(tail.head, cursor), tail.earliest, tail.closed)

    async def _page(
        self, key: StreamKey, cursor: int, limit: int, *, wait_more: bool
    ) -> StoredPage | datetime | None:
        """The page after `cursor`, or, when it is empty and the caller may wait for more, the
        stream's creation time (which stream of this key it is)."""
        found = await self._reader.page(key, cursor, limit, PAGE_BYTES)
        if found is None:
            raise NotFound(f"no stream {key.stream_id!r} in run {key.run_id!r}")
        position, records = found
        require_live(key, position)
        check_cursor(cursor, position.head, position.earliest)
        if not records and not position.closed and wait_more:
            return position.created_at
        return StoredPage(
            records=records,
            next_cursor=records[-1].sequence if records else cursor,
            head=position.head,
            earliest=position.earliest,
            closed=position.closed,
        )


def require_live(key: StreamKey, position: Position) -> None:
    """A soft-deleted stream (deleted while forks read it) answers 410 to direct reads."""
    if position.soft_deleted:
        raise errors.StreamGone(
            f"stream {key.stream_id!r} was deleted; only its forks still read its records"
        )


def check_cursor(cursor: int, head: int, earliest: int) -> None:
    """The exact cursor rule: a future cursor is invalid input, never an implicit reset; a
    cursor whose next record retention removed is gone (410), with what is still there."""
    if cursor > head:
        raise errors.CursorAheadOfHead(
            f"cursor {cursor} is ahead of the stream's head {head}", cursor=cursor, head=head
        )
    if cursor + 1 < earliest:
        raise errors.CursorExpired(
            f"record {cursor + 1} was removed by retention; the earliest retained is {earliest}",
            requested=cursor + 1,
            earliest=earliest,
            latest=head,
            reason="retention",
        )


def overtaken(gone: Overtaken) -> errors.CursorExpired:
    """What a wait answers once retention removed the next record it needed (410)."""
    return errors.CursorExpired(
        f"record {gone.requested} was removed by retention; the earliest retained is "
        f"{gone.earliest}",
        requested=gone.requested,
        earliest=gone.earliest,
        latest=gone.latest,
        reason=gone.reason,
    )


async def gone(reader: RecordReader, key: StreamKey) -> NoReturn:
    """The stream a wait followed is gone: deleted while forks read it (410, as the next read
    answers), or erased (404)."""
    found = await reader.page(key, 0, 1)
    if found is not None:
        require_live(key, found[0])
    raise NotFound(f"no stream {key.stream_id!r} in run {key.run_id!r}")
