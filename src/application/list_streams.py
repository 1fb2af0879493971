"""List a run's streams: those the caller may read and this deployment serves."""

from __future__ import annotations

from application.access import Caller
from application.errors import NotFound
from application.placement import Deployment
from application.ports import StreamRepository
from application.views import StreamList, stream_document
from domain.ids import check_id


class ListStreams:
    def __init__(self, streams: StreamRepository, deployment: Deployment) -> None:
        self._streams = streams
        self._deployment = deployment

    async def __call__(self, caller: Caller, run_id: str) -> StreamList:
        caller.require("streams:read")
        streams = await self._streams.list_run(caller.tenant, check_id("runID", run_id))
        if not streams:
            raise NotFound(f"no run {run_id!r}")
        return StreamList(
            streams=[
                stream_document(s)
                for s in streams
                if s.definition.authorization.may_read(caller.principal)
                and self._deployment.serves(s.definition)
            ]
        )
