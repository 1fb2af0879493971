"""Read one stream's definition and state."""

from __future__ import annotations

from application import tracing
from application.access import Caller, require_reader
from application.definitions import sources_within
from application.errors import NotFound
from application.expiry import AccessLog
from application.input_delivery import InputDeliveries
from application.placement import Deployment
from application.ports import StreamRepository
from application.views import StreamDocument, stream_document


class GetStream:
    def __init__(
        self,
        streams: StreamRepository,
        deployment: Deployment,
        deliveries: InputDeliveries,
        access: AccessLog,
    ) -> None:
        self._streams = streams
        self._deployment = deployment
        self._deliveries = deliveries
        self._access = access

    @tracing.use_case("get stream")
    async def __call__(self, caller: Caller, run_id: str, stream_id: str) -> StreamDocument:
        caller.require("streams:read")
        key = caller.key(run_id, stream_id)
        stream = await self._streams.load(key)
        if stream is None or (
            caller.runs is not None
            and not await sources_within(self._streams, key, stream.definition, caller.runs)
        ):
            raise NotFound(f"no stream {stream_id!r} in run {run_id!r}")
        self._deployment.require_home(stream.definition)
        stream.require_live()  # soft-deleted: 410
        # The same expiry check as Definitions.get, with the legal hold already at hand.
        await self._access.check(key, stream.definition, held=stream.state.legal_hold.enabled)
        require_reader(caller, stream.definition)
        if stream.definition.direction == "input":
            return stream_document(stream, await self._deliveries.status(key))
        return stream_document(stream)
