"""Create a Durable Streams stream (`PUT`): its definition resolved for this deployment, a
fork's source resolved (the fork point, the records it starts with, its content type) and its
pins inherited (who may read and write, redaction, placement, class), its expiry inherited
when the request sets none, then created with its initial records and, if asked, closed, in
one transaction.

What the request says is the protocol's to parse (entrypoints/durable_streams/protocol.py);
what it means is decided here, once."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import msgspec

from application import tracing
from application.access import Caller
from application.create_stream import CreateStream
from application.definitions import Definitions
from application.errors import NotFound
from application.forks import Forks
from application.placement import Deployment
from domain import errors
from domain.definition import (
    MAX_EXACT_INTEGER,
    DefinitionRequest,
    Expiry,
    Limits,
    Redaction,
    StreamDefinition,
    resolve_definition,
    with_source_pins,
)
from domain.offsets import Offset
from domain.records import NewRecord
from domain.stream import Stream
from domain.text import media_type_parts

# A protocol stream is an append-only log with no way to acknowledge: the native default unread
# ceiling (10,000 records, 64 MiB, counted from the earliest record while no consumer holds
# credit) made every such stream refuse appends for good (429) once it held that much. Its
# ceiling is the largest the native API allows; its total quotas are unset, as natively.
PROTOCOL_LIMITS = Limits(max_unread_items=MAX_EXACT_INTEGER, max_unread_bytes=MAX_EXACT_INTEGER)

# The body's records, once the stream's content type and redaction are known.
RecordsOf = Callable[[str, Redaction], list[NewRecord]]


class ForkOf(NamedTuple):
    """A fork's source and where it diverges (`offset` None: at the source's head; an offset as
    the client gave it, resolved against the source)."""

    run_id: str
    stream_id: str
    offset: Offset | int | None
    sub_offset: int


class CreateDurableStream:
    def __init__(
        self,
        create_stream: CreateStream,
        forks: Forks,
        definitions: Definitions,
        deployment: Deployment,
    ) -> None:
        self._create = create_stream
        self._forks = forks
        self._definitions = definitions
        self._deployment = deployment

    def check(self, caller: Caller, run_id: str, stream_id: str) -> None:
        """Decided before the request's headers are read: the caller may write streams, and
        the IDs name one (a bad ID is 400 before anything else)."""
        caller.require("streams:write")
        caller.key(run_id, stream_id)

    @tracing.use_case("create durable stream")
    async def __call__(
        self,
        caller: Caller,
        run_id: str,
        stream_id: str,
        *,
        content_type: str | None,
        default_content_type: str,
        expiry: Expiry | None,
        closed: bool,
        fork: ForkOf | None,
        records_of: RecordsOf,
    ) -> tuple[Stream, bool]:
        """(the stream, whether this request created it). An existing one is answered as it
        is only if its closure is the one asked for; one soft-deleted (its forks still read
        it) cannot be created again yet."""
        self.check(caller, run_id, stream_id)
        base = resolve_definition(
            DefinitionRequest(direction="output", stream_id=stream_id, limits=PROTOCOL_LIMITS),
            region=self._deployment.region,
            egress_region=self._deployment.egress_region,
        )
        forked = None
        inherited: list[NewRecord] = []
        if fork is not None:
            forked, inherited, source_type = await self._forks.resolve(
                caller, fork.run_id, fork.stream_id, fork.offset, fork.sub_offset, content_type
            )
            content_type = content_type or source_type
            expiry = await self._forks.inherited_expiry(
                caller, fork.run_id, fork.stream_id, expiry or Expiry()
            )
            # A fork reads its source's records under its source's pins: who may read and write
            # them, what is redacted (on the fork's own appends too), where they live, what
            # they are.
            source = await self._definitions.get(
                caller.key(fork.run_id, fork.stream_id), runs=caller.runs
            )
            base = with_source_pins(base, source)
        content_type = content_type or default_content_type
        records = records_of(content_type, base.redaction)
        definition = msgspec.structs.replace(
            base, content_type=content_type, fork=forked, expiry=expiry or Expiry()
        )
        initial = [*inherited, *records]
        try:
            stream, created = await self._create.create_resolved(
                caller, run_id, definition, initial=initial, closed=closed
            )
        except errors.DefinitionConflict:
            # The stream exists. Its media type with other parameters (`text/plain` for one
            # created as `text/plain; charset=utf-8`) is the same configuration, as it is for
            # an append: the request is answered with the stream as it is.
            existing = await self._existing(caller, run_id, stream_id)
            if existing is None or existing == definition:
                raise
            same_type = msgspec.structs.replace(definition, content_type=existing.content_type)
            if existing.content_type is None or same_type != existing:
                raise
            if _essence(existing.content_type) != _essence(content_type):
                raise
            stream, created = await self._create.create_resolved(
                caller, run_id, same_type, initial=initial, closed=closed
            )
        if not created and getattr(stream.state, "soft_deleted", False):
            raise errors.DefinitionConflict(
                f"stream {stream_id!r} was deleted and its forks still read it: it cannot be "
                "created again until they are gone"
            )
        if not created and stream.state.closed != closed:
            raise errors.DefinitionConflict(
                "the stream exists and is "
                + ("closed" if stream.state.closed else "open")
                + ": Stream-Closed on this request says otherwise"
            )
        return stream, created

    async def _existing(
        self, caller: Caller, run_id: str, stream_id: str
    ) -> StreamDefinition | None:
        try:
            return await self._definitions.get(
                caller.key(run_id, stream_id), runs=caller.runs, touch=False
            )
        except NotFound:
            return None


def _essence(content_type: str) -> str:
    return media_type_parts(content_type)[0].lower()
