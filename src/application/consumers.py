"""A stream's consumers: their keyset listing (streams:read) and an admin's removal of one
(streams:admin), which releases whatever the consumer held back."""

from __future__ import annotations

from datetime import datetime

import msgspec

from application import tracing
from application.access import Caller, require_reader
from application.definitions import Definitions
from application.group_commit import GroupCommit, run_one
from application.ports import Clock, Idempotency, StreamRepository
from application.views import ConsumerView
from domain import errors
from domain.events import Event
from domain.ids import check_id
from domain.stream import Stream

DEFAULT_LIMIT = 100
MAX_LIMIT = 1_000


class ConsumerList(msgspec.Struct, frozen=True):
    consumers: list[ConsumerView]
    next_after: str | None  # the last consumer_id answered, or null when none follows


class RemoveConsumerCommand:
    idempotency: Idempotency | None = None
    records = ()
    offset_of = None
    producer = None
    needs_consumers = True

    def __init__(self, consumer_id: str, now: datetime) -> None:
        self.consumer_id = consumer_id
        self.now = now

    def decide(self, stream: Stream, offset: int | None) -> list[Event]:
        return stream.remove_consumer(self.consumer_id, self.now)

    def answer(self, stream: Stream, events: list[Event]) -> None:
        return None


class DeleteConsumer:
    """Under a legal hold too: a hold keeps records, and a consumer is a reader's position."""

    def __init__(self, definitions: Definitions, commits: GroupCommit, clock: Clock) -> None:
        self._definitions = definitions
        self._commits = commits
        self._clock = clock

    @tracing.use_case("delete consumer")
    async def __call__(self, caller: Caller, run_id: str, stream_id: str, consumer_id: str) -> None:
        caller.require("streams:admin")
        key = caller.key(run_id, stream_id)
        check_id("consumerID", consumer_id)
        await self._definitions.get(key, runs=caller.runs)
        await run_one(self._commits, key, RemoveConsumerCommand(consumer_id, self._clock()))


class ListConsumers:
    def __init__(self, definitions: Definitions, streams: StreamRepository) -> None:
        self._definitions = definitions
        self._streams = streams

    @tracing.use_case("list consumers")
    async def __call__(
        self,
        caller: Caller,
        run_id: str,
        stream_id: str,
        after: str | None = None,
        limit: int = DEFAULT_LIMIT,
    ) -> ConsumerList:
        caller.require("streams:read")
        key = caller.key(run_id, stream_id)
        if not 1 <= limit <= MAX_LIMIT:
            raise errors.InvalidInput(f"limit must be 1 to {MAX_LIMIT}", field="limit")
        if after is not None:
            check_id("after", after)
        require_reader(caller, await self._definitions.get(key, runs=caller.runs))
        # One more than asked says whether another page follows.
        page = await self._streams.consumers(key, after, limit + 1)
        more = len(page) > limit
        page = page[:limit]
        return ConsumerList(
            consumers=[
                ConsumerView(
                    consumer_id=c.consumer_id,
                    acked_sequence=c.acked_sequence,
                    holds_credit=c.holds_credit,
                )
                for c in page
            ],
            next_after=page[-1].consumer_id if more else None,
        )
