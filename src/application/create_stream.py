"""Create a stream definition: idempotent for an identical definition, a conflict otherwise.

An `expires_at` that has already passed is refused (400): such a stream could only ever answer
404. An expired stream not erased yet is erased here first, so its ID can be created again at
once (from sequence 1), as after the sweep."""

from __future__ import annotations

import contextlib

from application.access import Caller
from application.errors import NotFound
from application.expiry import AccessLog, ExpireCommand
from application.placement import Deployment
from application.ports import Clock, StreamRepository
from application.views import StreamDocument, stream_document
from domain.definition import DefinitionRequest, resolve_definition
from domain.errors import DefinitionConflict, InvalidInput


class CreateStream:
    def __init__(
        self, streams: StreamRepository, clock: Clock, deployment: Deployment, access: AccessLog
    ) -> None:
        self._streams = streams
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
        key = caller.key(run_id, definition.stream_id)  # a bad ID is 400 before placement
        deployment.require_home(definition)
        now = self._clock()
        expires_at = definition.expiry.expires_at
        if expires_at is not None and expires_at <= now:
            raise InvalidInput(
                f"expiry.expires_at {expires_at.isoformat()} has already passed",
                field="expiry.expires_at",
            )
        stream, created = await self._streams.create(key, definition, now)
        if created and definition.expiry.enabled:
            # Its creation is its first access, recorded with it.
            self._access.remember(key, now, recorded=True)
        if not created and await self._access.expired(
            key, stream.definition, now, held=stream.state.legal_hold.enabled
        ):
            command = ExpireCommand(now, self._access.known(key), self._access.slack)
            with contextlib.suppress(NotFound):  # erased meanwhile
                await self._streams.update(key, [command])
            stream, created = await self._streams.create(key, definition, self._clock())
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
        return stream_document(stream), created
