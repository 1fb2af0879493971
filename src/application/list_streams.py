"""List a run's streams: those the caller may read and this deployment serves, and not expired.
Listing is not an access: it keeps no stream alive."""

from __future__ import annotations

from application.access import Caller
from application.definitions import sources_within
from application.errors import NotFound
from application.expiry import AccessLog
from application.placement import Deployment
from application.ports import StreamAccess, StreamRepository
from application.views import StreamList, stream_document


class ListStreams:
    def __init__(
        self,
        streams: StreamRepository,
        deployment: Deployment,
        access: AccessLog,
        recorded: StreamAccess,
    ) -> None:
        self._streams = streams
        self._deployment = deployment
        self._access = access
        self._recorded = recorded

    async def __call__(self, caller: Caller, run_id: str) -> StreamList:
        caller.require("streams:read")
        streams = await self._streams.list_run(caller.tenant, caller.run(run_id))
        streams = [s for s in streams if not s.state.soft_deleted]  # gone but for their forks
        if caller.runs is not None:  # a fork that reads a run the caller cannot see: not there
            streams = [
                s
                for s in streams
                if await sources_within(
                    self._streams,
                    caller.key(run_id, s.definition.stream_id),
                    s.definition,
                    caller.runs,
                )
            ]
        if not streams:
            raise NotFound(f"no run {run_id!r}")
        if any(s.definition.expiry.enabled for s in streams):
            recorded = await self._recorded.run_access(caller.tenant, run_id)
            streams = self._access.visible(streams, recorded)
            if not streams:  # every stream of the run expired: the run is gone with them
                raise NotFound(f"no run {run_id!r}")
        return StreamList(
            streams=[
                stream_document(s)
                for s in streams
                if s.definition.authorization.may_read(caller.principal)
                and self._deployment.serves(s.definition)
            ]
        )
