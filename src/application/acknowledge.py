"""Acknowledge a consumer's progress: only forward, only by the principal that owns it."""

from __future__ import annotations

from datetime import datetime

from application.access import Caller, require_reader
from application.definitions import Definitions
from application.group_commit import GroupCommit, run_one
from application.ports import Clock, Idempotency
from application.views import AckAnswer
from domain import errors
from domain.definition import MAX_SEQUENCE
from domain.events import Event
from domain.ids import check_id
from domain.stream import Stream


class AckCommand:
    idempotency: Idempotency | None = None
    records = ()
    producer = None

    def __init__(self, caller: Caller, consumer_id: str, sequence: int, now: datetime) -> None:
        self.caller = caller
        self.consumer_id = consumer_id
        self.sequence = sequence
        self.now = now
        self.offset_of = sequence if sequence > 0 else None

    def decide(self, stream: Stream, offset: int | None) -> list[Event]:
        require_reader(self.caller, stream.definition)
        return stream.acknowledge(
            self.consumer_id, self.caller.principal, self.sequence, offset, self.now
        )

    def answer(self, stream: Stream, events: list[Event]) -> AckAnswer:
        return AckAnswer(
            consumer_id=self.consumer_id,
            acked_sequence=stream.state.consumers[self.consumer_id].acked_sequence,
            credit=stream.credit(),
        )


class Acknowledge:
    def __init__(self, definitions: Definitions, commits: GroupCommit, clock: Clock) -> None:
        self._definitions = definitions
        self._commits = commits
        self._clock = clock

    async def __call__(
        self, caller: Caller, run_id: str, stream_id: str, consumer_id: str, sequence: int
    ) -> AckAnswer:
        caller.require("streams:read")
        key = caller.key(run_id, stream_id)
        check_id("consumerID", consumer_id)
        if not 0 <= sequence <= MAX_SEQUENCE:
            raise errors.InvalidInput(f"sequence must be 0 to {MAX_SEQUENCE}", field="sequence")
        require_reader(caller, await self._definitions.get(key, runs=caller.runs))
        command = AckCommand(caller, consumer_id, sequence, self._clock())
        return await run_one(self._commits, key, command)
