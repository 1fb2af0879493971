"""Read records after an exclusive cursor, optionally waiting for the next append."""

from __future__ import annotations

import time
from datetime import datetime

from application import tracing
from application.access import Caller, require_reader
from application.definitions import Definitions
from application.errors import NotFound, Unauthenticated
from application.live_slots import LiveSlots, Slot
from application.ports import Position, RecordReader
from application.tokens import Lease, TokenCache
from application.views import RecordsPage, StoredPage
from application.wake import Listener, WakeRegistry
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
    ) -> None:
        self._definitions = definitions
        # A read that waits holds one of its principal's live-connection slots while it waits.
        self._slots = slots or LiveSlots(1_000)
        # A waiting read is refused (401) once its token is revoked or expires meanwhile.
        self._tokens = tokens or TokenCache()
        self._reader = reader
        self._wake = wake

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
        require_reader(
            caller, await self._definitions.get(key, delivers_data=True, runs=caller.runs)
        )
        if wait <= 0:
            page = await self._page(key, cursor, limit, wait_more=False)
            assert isinstance(page, StoredPage)
            return page
        deadline = time.monotonic() + wait
        # Listen before reading, so an append committed between the read and the wait still
        # wakes this reader.
        lease = self._tokens.hold(caller)
        try:
            with self._wake.listen(key) as listener:
                lease.on_end(listener.wake)
                return await self._wait(caller, key, cursor, limit, deadline, listener, lease)
        finally:
            self._tokens.release(lease)

    async def _wait(
        self,
        caller: Caller,
        key: StreamKey,
        cursor: int,
        limit: int,
        deadline: float,
        listener: Listener,
        lease: Lease,
    ) -> StoredPage:
        """The first non-empty page (or the empty one at the deadline). Only a read that has
        to wait takes a slot: one answered at once holds no connection open, so it is never
        refused for the cap. The slot is given back however the wait ends (records, the
        deadline, an error, or the request cancelled)."""
        slot: Slot | None = None
        created_at = None
        try:
            while True:
                if lease.ended:
                    raise Unauthenticated("unknown, revoked or expired token")
                if listener.deleted:
                    raise NotFound(f"no stream {key.stream_id!r} in run {key.run_id!r}")
                remaining = deadline - time.monotonic()
                page = await self._page(key, cursor, limit, wait_more=remaining > 0)
                if lease.ended:
                    raise Unauthenticated("unknown, revoked or expired token")
                if isinstance(page, StoredPage):
                    if slot is not None and page.records and tracing.on():
                        live_delivery(key, page.records[0].sequence, page.records[-1].sequence)
                    return page
                if created_at is not None and page != created_at:
                    # Deleted while waiting, and created again since: another stream.
                    raise NotFound(f"no stream {key.stream_id!r} in run {key.run_id!r}")
                created_at = page
                if slot is None:
                    slot = self._slots.admit(caller)  # 429 past the cap, before waiting
                await listener.wait(remaining)
        finally:
            self._slots.release(caller, slot)

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


def live_delivery(key: StreamKey, first: int, last: int) -> None:
    """A waiting read's records, as a span linked to the appends that brought them."""
    span = tracing.start(
        "live delivery",
        links=tracing.APPENDS.of(key, first, last),
        attributes={
            **tracing.stream_attributes(key),
            "ductor_streams.first_sequence": first,
            "ductor_streams.last_sequence": last,
        },
    )
    if span is not None:
        span.end()
