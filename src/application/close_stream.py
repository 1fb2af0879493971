"""Close a stream: nothing more is appended; closing again is a no-op."""

from __future__ import annotations

from datetime import datetime

from application import tracing
from application.access import Caller, require_writer
from application.definitions import Definitions
from application.group_commit import GroupCommit, run_one
from application.ports import Clock, Idempotency
from application.views import StreamDocument, stream_document
from domain.events import Event
from domain.stream import Stream


class CloseCommand:
    idempotency: Idempotency | None = None
    records = ()
    offset_of = None
    producer = None
    needs_consumers = True  # it answers the stream document

    def __init__(self, caller: Caller, now: datetime) -> None:
        self.caller = caller
        self.now = now

    def decide(self, stream: Stream, offset: int | None) -> list[Event]:
        require_writer(self.caller, stream.definition)
        return stream.close(self.now)

    def answer(self, stream: Stream, events: list[Event]) -> StreamDocument:
        return stream_document(stream)


class CloseStream:
    def __init__(self, definitions: Definitions, commits: GroupCommit, clock: Clock) -> None:
        self._definitions = definitions
        self._commits = commits
        self._clock = clock

    @tracing.use_case("close stream")
    async def __call__(self, caller: Caller, run_id: str, stream_id: str) -> StreamDocument:
        caller.require("streams:write")
        key = caller.key(run_id, stream_id)
        require_writer(caller, await self._definitions.get(key, runs=caller.runs))
        return await run_one(self._commits, key, CloseCommand(caller, self._clock()))
