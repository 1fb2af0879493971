"""Delete (erase) a stream, or every stream of a run at once (streams:admin).

The decision is the aggregate's (`Stream.delete`: refused while a legal hold is on), taken under
the stream-row lock like every other command, so an append either commits before the delete or
finds no stream (404). The port erases the stream's rows in that transaction and queues its
object bodies for the deletion workers; the ID is free again at once."""

from __future__ import annotations

from datetime import datetime

from application import tracing
from application.access import Caller
from application.definitions import Definitions
from application.errors import NotFound
from application.group_commit import GroupCommit, run_one
from application.ports import Clock, Idempotency, StreamRepository
from application.tenant_limits import ByteLimit, StreamLimit
from domain import errors
from domain.events import Event
from domain.stream import Stream


class DeleteCommand:
    idempotency: Idempotency | None = None
    records = ()
    offset_of = None
    producer = None
    erases = True

    def __init__(self, now: datetime) -> None:
        self.now = now

    def decide(self, stream: Stream, offset: int | None) -> list[Event]:
        return stream.delete(self.now)

    def answer(self, stream: Stream, events: list[Event]) -> None:
        return None


class DeleteStream:
    def __init__(
        self,
        definitions: Definitions,
        commits: GroupCommit,
        clock: Clock,
        stream_limit: StreamLimit | None = None,
    ) -> None:
        self._definitions = definitions
        self._commits = commits
        self._clock = clock
        # The tenant's count of streams, read again at its next creation: the room a deletion
        # gives back is there to take at once (a process counted only its own creations until
        # its next read, a second later, and refused creations past the limit meanwhile).
        self._stream_limit = stream_limit

    @tracing.use_case("delete stream")
    async def __call__(self, caller: Caller, run_id: str, stream_id: str) -> None:
        caller.require("streams:admin")
        key = caller.key(run_id, stream_id)
        await self._definitions.get(key, runs=caller.runs)  # not found, or homed in another region
        await run_one(self._commits, key, DeleteCommand(self._clock()))
        if self._stream_limit is not None:
            self._stream_limit.forget(caller.tenant)


class DeleteRun:
    """All or nothing: every stream of the run is locked, and if any is held (or homed in
    another region) none is deleted."""

    def __init__(
        self,
        streams: StreamRepository,
        definitions: Definitions,
        clock: Clock,
        byte_limit: ByteLimit | None = None,
        stream_limit: StreamLimit | None = None,
    ) -> None:
        self._streams = streams
        self._definitions = definitions
        self._clock = clock
        self._byte_limit = byte_limit
        self._stream_limit = stream_limit

    @tracing.use_case("delete run")
    async def __call__(self, caller: Caller, run_id: str) -> None:
        caller.require("streams:admin")
        caller.run(run_id)
        deployment = self._definitions.deployment

        def served_here(stream: Stream) -> None:
            deployment.require_home(stream.definition)

        try:
            await self._streams.delete_run(caller.tenant, run_id, self._clock(), served_here)
        except NotFound:
            raise NotFound(f"no run {run_id!r}") from None
        except errors.LegalHoldActive as held:
            # Which stream holds the run back: the stream's own answer names none.
            stream_id = held.extra.get("stream_id")
            raise errors.LegalHoldActive(
                f"stream {stream_id!r} of run {run_id!r} is under a legal hold: the run cannot "
                "be deleted until it is lifted (nothing was deleted)",
                stream_id=stream_id,
            ) from None
        for limit in (self._byte_limit, self._stream_limit):
            if limit is not None:
                limit.forget(caller.tenant)  # the room it gave back, taken at once
