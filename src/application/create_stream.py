"""Create a stream definition: idempotent for an identical definition, a conflict otherwise.

An `expires_at` that has already passed is refused (400): such a stream could only ever answer
404. An expired stream not erased yet is erased here first, so its ID can be created again at
once (from sequence 1), as after the sweep. A new stream of a tenant that holds its limit of
streams is refused (409 `quota-exhausted`, application/tenant_limits.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from datetime import datetime

import msgspec

from application import tracing
from application.access import Caller, require_reader, require_writer
from application.append_records import ProduceCommand
from application.errors import NotFound
from application.expiry import AccessLog, ExpireCommand
from application.group_commit import claimed_bytes
from application.input_delivery import check_input_ids
from application.placement import Deployment
from application.ports import Clock, Command, StreamRepository
from application.tenant_limits import ByteLimit, StreamLimit
from application.throughput import Throughput
from application.views import StreamDocument, stream_document
from domain.definition import DefinitionRequest, StreamDefinition, resolve_definition
from domain.errors import DefinitionConflict, InvalidInput, QuotaExhausted
from domain.records import NewRecord
from domain.stream import Stream, StreamKey, definition_bytes

# The commands a creation decides in its own transaction, made for the instant it happens at.
_Then = Callable[[datetime], Sequence[Command]]


def _nothing(now: datetime) -> Sequence[Command]:
    return ()


class CreateStream:
    def __init__(
        self,
        streams: StreamRepository,
        clock: Clock,
        deployment: Deployment,
        access: AccessLog,
        throughput: Throughput | None = None,
        limit: StreamLimit | None = None,
        byte_limit: ByteLimit | None = None,
    ) -> None:
        self._streams = streams
        self._limit = limit
        self._byte_limit = byte_limit
        self._throughput = throughput or Throughput()
        self._clock = clock
        self._deployment = deployment
        self._access = access

    async def __call__(
        self, caller: Caller, run_id: str, request: DefinitionRequest
    ) -> tuple[StreamDocument, bool]:
        caller.require("streams:write")
        deployment = self._deployment
        definition = resolve_definition(
            request, region=deployment.region, egress_region=deployment.egress_region
        )
        stream, created = await self._create(caller, run_id, definition, _nothing)
        return stream_document(stream), created

    async def create_resolved(
        self,
        caller: Caller,
        run_id: str,
        definition: StreamDefinition,
        *,
        initial: Sequence[NewRecord] = (),
        closed: bool = False,
    ) -> tuple[Stream, bool]:
        """Create a stream from a definition already resolved (the Durable Streams surface),
        with `initial` appended and, if `closed`, closed, all in the creation's transaction.
        An existing stream with the same definition is answered as it is (`created` False; the
        caller compares its closure), one with another definition is a conflict."""
        caller.require("streams:write")

        def then(now: datetime) -> Sequence[Command]:
            if not initial and not closed:
                return ()
            return [ProduceCommand(caller, initial, now, close=closed)]

        return await self._create(caller, run_id, definition, then)

    @tracing.use_case("create stream")
    async def _create(
        self, caller: Caller, run_id: str, definition: StreamDefinition, then: _Then
    ) -> tuple[Stream, bool]:
        key = caller.key(run_id, definition.stream_id)  # a bad ID is 400 before placement
        if definition.direction == "input":
            check_input_ids(key)
        self._deployment.require_home(definition)
        now = self._clock()
        expires_at = definition.expiry.expires_at
        if expires_at is not None and expires_at <= now:
            raise InvalidInput(
                f"expiry.expires_at {expires_at.isoformat()} has already passed",
                field="expiry.expires_at",
            )
        reserved = await self._within_limit(key)
        created = False
        try:
            stream, created = await self._created(caller, key, definition, now, then, reserved)
            return stream, created
        finally:
            if reserved:
                assert self._limit is not None
                self._limit.made(key.tenant, created)

    async def _created(
        self,
        caller: Caller,
        key: StreamKey,
        definition: StreamDefinition,
        now: datetime,
        then: _Then,
        reserved: bool,
    ) -> tuple[Stream, bool]:
        shown = caller.runs is None  # (a refusal says what the tenant holds: `TenantRoom`)
        stream, created = await self._create_with(key, definition, now, then, shown, reserved)
        if created and definition.expiry.enabled:
            # Its creation is its first access, recorded with it.
            self._access.remember(key, now, recorded=True)
        if not created and await self._access.expired(
            key, stream.definition, now, held=stream.state.legal_hold.enabled
        ):
            command = ExpireCommand(now, self._access.known(key), self._access.slack)
            with contextlib.suppress(NotFound):  # erased meanwhile
                await self._streams.update(key, [command])
            if self._byte_limit is not None:
                self._byte_limit.forget(key.tenant)  # what it held, given back for its records
            now = self._clock()
            stream, created = await self._create_with(key, definition, now, then, shown, reserved)
        if not created:
            # Its creation repeated answers the stream as it is: only to a caller its pinned
            # authorization lets write it and read it (the answer is its document).
            require_writer(caller, stream.definition)
            require_reader(caller, stream.definition)
        if not created and stream.state.soft_deleted:
            raise DefinitionConflict(
                f"stream {definition.stream_id!r} was deleted while forks still read it: its ID "
                "cannot be created again until the last fork is gone"
            )
        if not created and stream.definition != definition:
            raise DefinitionConflict(
                f"stream {definition.stream_id!r} already exists with another definition; "
                "definitions are immutable"
            )
        return stream, created

    async def _within_limit(self, key: StreamKey) -> bool:
        """Refuse a new stream to a tenant that holds its limit of them; a stream already
        there is answered as before (its creation repeated, or a conflict). True: one is
        reserved for it until it is made (`StreamLimit.take`), so that creations in flight at
        once pass the limit by no more than the room there was (checked, then counted once
        made, fifty at once passed 30 by 38)."""
        limit = self._limit
        if limit is None or not limit.limit:
            return False
        if await limit.take(key.tenant):
            return True
        if await self._streams.load(key) is not None:
            return False
        raise QuotaExhausted(
            f"the tenant holds {limit.limit} streams, its limit: no stream is created until "
            "some are deleted",
            limit=limit.limit,
        )

    async def _create_with(
        self,
        key: StreamKey,
        definition: StreamDefinition,
        now: datetime,
        then: _Then,
        shown: bool = True,
        reserved: bool = False,
    ) -> tuple[Stream, bool]:
        commands = then(now)
        byte_limit = self._byte_limit
        if byte_limit is None or not byte_limit.limit:
            stream, created = await self._streams.create(key, definition, now, commands)
        else:
            stream, created = await self._create_within(
                byte_limit, key, definition, now, commands, shown
            )
        if created:
            if not reserved and self._limit is not None:  # (a reservation's: counted by `made`)
                self._limit.created(key.tenant)
            self._throughput.created(commands)
            context = tracing.current()
            if context is not None:
                for command in commands:
                    if command.records:  # the initial records, from sequence 1
                        tracing.APPENDS.appended(key, 1, len(command.records), context)
        return stream, created

    async def _create_within(
        self,
        byte_limit: ByteLimit,
        key: StreamKey,
        definition: StreamDefinition,
        now: datetime,
        commands: Sequence[Command],
        shown: bool,
    ) -> tuple[Stream, bool]:
        """The creation within the tenant's bytes: a new stream counts its definition and its
        row (`definition_bytes`: its schema may be 64 KiB, and 500 of them at once grew the
        database by 67 MB past a tenant's limit), and its first records count as an append's
        do; refused, nothing of the stream is created. A stream already there is answered as
        before."""
        own = definition_bytes(definition)
        claimed = own + sum(claimed_bytes(command) for command in commands)
        room = await byte_limit.reserve(key.tenant, claimed, shown=shown)
        created = False
        try:
            if room is not None:
                if room.held + own > room.limit and await self._streams.load(key) is None:
                    raise room.refusal(own)
                before = own
                for command in commands:  # each after what the ones before it may store
                    after = msgspec.structs.replace(room, held=room.held + before)
                    command.tenant_room = after  # type: ignore[attr-defined]
                    before += claimed_bytes(command)
            stream, created = await self._streams.create(key, definition, now, commands)
            return stream, created
        finally:
            byte_limit.release(key.tenant, claimed, claimed if created else 0)
