"""Reads for the Durable Streams surface: raw records with the stream's position, a wait for
the next append, and a live follow.

Waiting and following ride the process's shared tail of the stream (`LiveTails`): however many
clients long-poll or follow a stream, each append is read from the database once per process,
and every waiting client is served from that read."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from datetime import datetime

import msgspec

from application.access import Caller, require_reader
from application.definitions import Definitions
from application.errors import NotFound, Unauthenticated
from application.live import (
    Delivery,
    LiveTails,
    Overtaken,
    RecordsDelivered,
    Revoked,
    StreamEnded,
    StreamGone,
)
from application.live_slots import LiveSlots, Slot
from application.offsets import minting_of
from application.ports import Position, RecordReader, StoredRecord
from application.read_records import check_cursor, gone, overtaken
from application.tokens import Lease, TokenCache
from application.waiting import back_to_work
from domain import errors
from domain.definition import StreamDefinition
from domain.offsets import UNSTATED, Minting, Offset
from domain.stream import StreamKey


class Page(msgspec.Struct, frozen=True):
    position: Position
    records: list[StoredRecord]
    # The sequence the page was read after (None: at the head, so none); the start of what
    # retention kept when the read was from the start, or from another stream's offset.
    start: int | None = None
    # The offsets of this stream (of the incarnation the page was read from).
    minting: Minting = msgspec.field(default_factory=Minting)


class Waited(msgspec.Struct, frozen=True):
    """What a wait for an append ended with: records, or none (timed out, or `closed`)."""

    records: list[StoredRecord]
    head: int
    closed: bool


def told_in_offsets(gone: errors.CursorExpired, minting: Minting) -> errors.CursorExpired:
    """`gone` as a reader of offsets needs it: the offset it read after, the offset to read
    after for the earliest record retention kept, and the stream's tail, each as `minting`
    states them, instead of sequences it never sees."""
    asked = minting.text(gone.extra["requested"] - 1)
    earliest = minting.text(gone.extra["earliest"] - 1)
    return errors.CursorExpired(
        f"the records after offset {asked} were removed by retention: the earliest kept "
        f"follows offset {earliest} (read from it, or from -1, the stream's start)",
        offset=asked,
        earliest_offset=earliest,
        next_offset=minting.text(gone.extra["latest"]),
        reason=gone.extra["reason"],
    )


def _gone_if_soft_deleted(position: Position) -> None:
    if getattr(position, "soft_deleted", False):
        raise errors.StreamGone("the stream was deleted; forks still read what it held")


class DurableReads:
    def __init__(
        self,
        definitions: Definitions,
        reader: RecordReader,
        tails: LiveTails,
        heartbeat_seconds: float = 15.0,
        tokens: TokenCache | None = None,
        slots: LiveSlots | None = None,
    ) -> None:
        self._definitions = definitions
        # A long-poll and a live=sse read each hold one of the principal's live-connection
        # slots (the same cap as native subscriptions and waiting reads) while they are open.
        self._slots = slots or LiveSlots(1_000)
        self._reader = reader
        self._tails = tails
        self._heartbeat = heartbeat_seconds
        # A wait or a follow ends once the token it was opened with is revoked or expires.
        self._tokens = tokens or TokenCache()

    async def open(
        self, caller: Caller, run_id: str, stream_id: str
    ) -> tuple[StreamKey, StreamDefinition]:
        """The stream a read names, once the caller may read it (counts as an access)."""
        caller.require("streams:read")
        key = caller.key(run_id, stream_id)
        definition = await self._definitions.get(key, delivers_data=True, runs=caller.runs)
        require_reader(caller, definition)
        return key, definition

    async def page(
        self,
        key: StreamKey,
        cursor: Offset | int | None,
        limit: int,
        created_at: datetime | None = None,
        *,
        from_start: bool = False,
        max_bytes: int | None = None,
        fork: bool = False,
    ) -> Page:
        """The records after `cursor` (None: the head, so none), at most `limit`, with the
        position read in the same snapshot; of the stream created at `created_at` when one is
        given (another, created again under its ID since, is not found). `from_start`: the
        cursor is the stream's start, so the earliest records retention kept are the answer
        rather than 410. `max_bytes`: the page's payload budget (`RecordReader.page`).

        A cursor given as an offset is resolved against the stream that answers
        (`Minting.resolve`): one another stream minted (one deleted since, whose ID this stream
        now has) reads from this stream's start. `fork`: the stream is a fork (its inherited
        offsets are its sources')."""
        offset = Offset(UNSTATED, cursor) if isinstance(cursor, int) else cursor
        found = await self._reader.page(
            key, offset.sequence if offset else 0, limit if offset is not None else 1, max_bytes
        )
        if found is None or (created_at is not None and found[0].created_at != created_at):
            raise NotFound(f"no stream {key.stream_id!r} in run {key.run_id!r}")
        position, records = found
        _gone_if_soft_deleted(position)
        minting = await self.minting(key, position.created_at, fork=fork)
        if offset is None:
            return Page(position, [], None, minting)
        if minting.resolve(offset) is None:  # another stream's: this stream's start
            return await self.page(
                key,
                0,
                limit,
                position.created_at,
                from_start=True,
                max_bytes=max_bytes,
                fork=fork,
            )
        if from_start:
            return Page(position, records, max(0, position.earliest - 1), minting)
        try:
            check_cursor(offset.sequence, position.head, position.earliest)
        except errors.CursorExpired as gone:
            raise told_in_offsets(gone, minting) from None
        return Page(position, records, offset.sequence, minting)

    async def minting(
        self, key: StreamKey, created_at: datetime | None, *, fork: bool = False
    ) -> Minting:
        """The offsets of the stream created at `created_at`: a fork's inherited positions
        carry its sources' incarnations (its chain, read once per fork incarnation)."""
        return await minting_of(self._reader, key, created_at, fork=fork)

    async def wait(
        self,
        key: StreamKey,
        cursor: int,
        timeout: float,
        *,
        caller: Caller,
        definition: StreamDefinition,
        created_at: datetime | None = None,
        minting: Minting | None = None,
    ) -> Waited:
        """The first records after `cursor` appended within `timeout` seconds, on the shared
        tail; or none, at once when the stream is (or becomes) closed at `cursor`. Refused
        (401) as soon as `caller`'s token is revoked or expires meanwhile. Refused (429)
        before it waits when the principal's live connections are at the cap. Overtaken by
        retention meanwhile: 410, told in `minting`'s offsets when it is given."""
        slot = self._slots.admit(caller)
        lease = self._tokens.hold(caller)
        try:
            # A read waiting keeps an idle-expiring stream alive, as a subscription does.
            with self._definitions.access.kept_open(key, definition):
                waited = await self._wait(key, cursor, timeout, lease, created_at)
        except errors.CursorExpired as gone:
            if minting is None:
                raise
            raise told_in_offsets(gone, minting) from None
        finally:
            self._tokens.release(lease)
            self._slots.release(caller, slot)
        await back_to_work()  # (application/waiting.py, "Turns at work")
        return waited

    def hold_live(self, caller: Caller) -> Slot:
        """A live-connection slot for a `live=sse` read, taken before its response starts
        (429 past the cap); the response gives it back with `release_live` when it ends."""
        return self._slots.admit(caller)

    def release_live(self, caller: Caller, slot: Slot) -> None:
        self._slots.release(caller, slot)

    async def _wait(
        self,
        key: StreamKey,
        cursor: int,
        timeout: float,
        lease: Lease,
        created_at: datetime | None,
    ) -> Waited:
        # `created_at`: the stream the cursor was checked against (LiveTails.follow).
        follow = self._tails.follow(
            key, cursor, max(self._heartbeat, timeout + 1), lease, created_at
        )
        head, closed, deleted = cursor, False, False
        deadline = asyncio.timeout(timeout)
        try:
            async with contextlib.aclosing(follow), deadline:
                async for delivery in follow:
                    match delivery:
                        case RecordsDelivered(records=records):
                            tail = self._tails.tail(key)
                            head = tail.head if tail is not None else records[-1].sequence
                            last = records[-1].sequence
                            closed = tail is not None and tail.closed and last >= tail.head
                            return Waited(list(records), max(head, last), closed)
                        case StreamEnded(head=end):
                            return Waited([], end, True)
                        case Overtaken() as passed:
                            raise overtaken(passed)
                        case StreamGone():
                            deleted = True  # said after the deadline's scope: it may pass
                            break
                        case Revoked():
                            raise Unauthenticated("unknown, revoked or expired token")
        except TimeoutError:
            # The wait's own deadline: nothing came. Any other timeout (the database did not
            # answer within its bound: `Unanswered`) is an outage, not "up to date".
            if not deadline.expired():
                raise
        if deleted:
            await gone(self._reader, key)
        return Waited([], head, closed)

    async def follow(
        self,
        key: StreamKey,
        definition: StreamDefinition,
        cursor: int,
        *,
        caller: Caller,
        created_at: datetime | None = None,
    ) -> AsyncGenerator[Delivery, None]:
        """Every record after `cursor`, live (see `LiveTails.follow`, `created_at` the stream
        the cursor was checked against); each delivery and heartbeat is an access, so an open
        follower keeps an idle-expiring stream alive. It ends with `Revoked` once `caller`'s
        token is revoked or expires. The caller closes it (`contextlib.aclosing`)."""
        lease = self._tokens.hold(caller)
        try:
            tails = self._tails.follow(key, cursor, self._heartbeat, lease, created_at)
            async with contextlib.aclosing(
                self._definitions.access.keep_touching(key, definition, tails)
            ) as follow:
                async for delivery in follow:
                    yield delivery
        finally:
            self._tokens.release(lease)

    def live_position(self, key: StreamKey) -> tuple[int, bool] | None:
        """The head and closure the shared tail last read (None when nobody follows)."""
        tail = self._tails.tail(key)
        return None if tail is None else (tail.head, tail.closed)
