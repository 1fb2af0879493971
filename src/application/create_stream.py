"""Create a stream definition: idempotent for an identical definition, a conflict otherwise."""

from __future__ import annotations

from application.access import Caller
from application.placement import Deployment
from application.ports import Clock, StreamRepository
from application.views import StreamDocument, stream_document
from domain.definition import DefinitionRequest, resolve_definition
from domain.errors import DefinitionConflict


class CreateStream:
    def __init__(self, streams: StreamRepository, clock: Clock, deployment: Deployment) -> None:
        self._streams = streams
        self._clock = clock
        self._deployment = deployment

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
        stream, created = await self._streams.create(key, definition, self._clock())
        if not created and stream.definition != definition:
            raise DefinitionConflict(
                f"stream {definition.stream_id!r} already exists with another definition; "
                "definitions are immutable"
            )
        return stream_document(stream), created
