"""Subscribe to a stream: cursor checked before anything streams, then live deliveries."""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator

from application.access import Caller, require_reader
from application.definitions import Definitions
from application.errors import NotFound
from application.live import Delivery, LiveTails
from application.ports import RecordReader
from application.read_records import check_cursor
from domain import errors
from domain.definition import MAX_SEQUENCE


class TooManySubscriptions(errors.Backpressure):
    code = "too-many-subscriptions"


class Subscription:
    """An admitted subscription; it holds a slot of its principal until it ends (or is dropped
    unstarted and collected)."""

    def __init__(self, deliveries: AsyncIterator[Delivery]) -> None:
        self._deliveries = deliveries

    def __aiter__(self) -> AsyncIterator[Delivery]:
        return self._deliveries


class SubscriptionSlots:
    """Per-principal cap on concurrent subscriptions in this process."""

    def __init__(self, max_per_principal: int) -> None:
        self._max = max_per_principal
        self._active: dict[tuple[str, str], weakref.WeakSet[Subscription]] = {}

    def admit(self, caller: Caller, subscription: Subscription) -> None:
        who = (caller.tenant, caller.principal)
        active = self._active.setdefault(who, weakref.WeakSet())
        if len(active) >= self._max:
            raise TooManySubscriptions(
                f"principal {caller.principal!r} already has {self._max} open subscriptions",
                retry_after=5,
            )
        active.add(subscription)

    def release(self, caller: Caller, subscription: Subscription) -> None:
        who = (caller.tenant, caller.principal)
        active = self._active.get(who)
        if active is not None:
            active.discard(subscription)
            if not active:
                del self._active[who]

    def count(self) -> int:
        return sum(len(a) for a in self._active.values())


class Subscribe:
    def __init__(
        self,
        definitions: Definitions,
        reader: RecordReader,
        tails: LiveTails,
        slots: SubscriptionSlots,
        heartbeat_seconds: float = 15.0,
    ) -> None:
        self._definitions = definitions
        self._reader = reader
        self._tails = tails
        self._slots = slots
        self._heartbeat = heartbeat_seconds

    async def __call__(
        self, caller: Caller, run_id: str, stream_id: str, cursor: int
    ) -> Subscription:
        caller.require("streams:read")
        key = caller.key(run_id, stream_id)
        if not 0 <= cursor <= MAX_SEQUENCE:
            raise errors.InvalidInput(f"cursor must be 0 to {MAX_SEQUENCE}", field="cursor")
        require_reader(caller, await self._definitions.get(key, delivers_data=True))
        found = await self._reader.page(key, cursor, 1)
        if found is None:
            raise NotFound(f"no stream {stream_id!r} in run {run_id!r}")
        position, _ = found
        check_cursor(cursor, position.head, position.earliest)

        async def deliveries() -> AsyncIterator[Delivery]:
            try:
                async for delivery in self._tails.follow(key, cursor, self._heartbeat):
                    yield delivery
            finally:
                self._slots.release(caller, subscription)

        subscription = Subscription(deliveries())
        self._slots.admit(caller, subscription)
        return subscription
