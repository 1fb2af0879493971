"""Subscribe to a stream: cursor checked before anything streams, then live deliveries."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from datetime import datetime

from application.access import Caller, require_reader
from application.definitions import Definitions
from application.errors import NotFound
from application.live import Delivery, LiveTails
from application.live_slots import LiveSlots, Slot, TooManySubscriptions
from application.ports import RecordReader
from application.read_records import check_cursor, require_live
from application.tokens import TokenCache
from domain import errors
from domain.definition import MAX_SEQUENCE, StreamDefinition
from domain.stream import StreamKey

__all__ = ["Stopping", "Subscribe", "TooManySubscriptions"]


class Stopping(errors.Backpressure):
    code = "unavailable"


class Subscribe:
    def __init__(
        self,
        definitions: Definitions,
        reader: RecordReader,
        tails: LiveTails,
        slots: LiveSlots,
        heartbeat_seconds: float = 15.0,
        tokens: TokenCache | None = None,
    ) -> None:
        self._definitions = definitions
        self._reader = reader
        self._tails = tails
        self._slots = slots
        self._heartbeat = heartbeat_seconds
        # The subscription ends (`Revoked`) once its token is revoked or expires.
        self._tokens = tokens or TokenCache()

    async def __call__(
        self, caller: Caller, run_id: str, stream_id: str, cursor: int
    ) -> AsyncGenerator[Delivery, None]:
        """Check everything that can be refused, then hand back the deliveries: an async
        generator the caller must close (`contextlib.aclosing`) to end the subscription."""
        key, definition, created_at = await self._checked(caller, run_id, stream_id, cursor)

        async def deliveries(slot: Slot) -> AsyncGenerator[Delivery, None]:
            lease = self._tokens.hold(caller)
            try:
                # Each delivery and heartbeat is an access: an open subscription keeps an
                # idle-expiring stream alive.
                follow = self._tails.follow(key, cursor, self._heartbeat, lease, created_at)
                async with contextlib.aclosing(
                    self._definitions.access.keep_touching(key, definition, follow)
                ) as follow:
                    async for delivery in follow:
                        yield delivery
            finally:
                self._tokens.release(lease)
                self._slots.release(caller, slot)

        return deliveries(self._slots.admit(caller))

    async def check(self, caller: Caller, run_id: str, stream_id: str, cursor: int) -> None:
        """Everything a subscription would be refused for, and nothing more (HEAD): no slot is
        taken and nothing is followed."""
        await self._checked(caller, run_id, stream_id, cursor)
        self._slots.check(caller)

    async def _checked(
        self, caller: Caller, run_id: str, stream_id: str, cursor: int
    ) -> tuple[StreamKey, StreamDefinition, datetime | None]:
        caller.require("streams:read")
        if self._tails.ending:
            raise Stopping("this server is stopping; subscribe again (to another one)")
        key = caller.key(run_id, stream_id)
        if not 0 <= cursor <= MAX_SEQUENCE:
            raise errors.InvalidInput(f"cursor must be 0 to {MAX_SEQUENCE}", field="cursor")
        definition = await self._definitions.get(key, delivers_data=True, runs=caller.runs)
        require_reader(caller, definition)
        found = await self._reader.page(key, cursor, 1)
        if found is None:
            raise NotFound(f"no stream {stream_id!r} in run {run_id!r}")
        position, _ = found
        require_live(key, position)
        check_cursor(cursor, position.head, position.earliest)
        return key, definition, position.created_at

    def end_all(self) -> None:
        """End every live subscription of this process now (it is stopping)."""
        self._tails.end_all()
