"""Look a stream's definition up for an operation in this deployment: not-found (no stream, or
an expired one), misdirected (metadata homed elsewhere) and, for data delivery,
egress-region-denied are decided here, and the access is counted for the stream's expiry.
(The stream ports keep decoded definitions: they are immutable.)

A caller restricted to some runs (`Caller.runs`, passed as `runs`) does not see a fork whose
source chain reaches a run outside them: the fork's prefix is that run's data, so the fork is
not found, as a fork of another tenant's stream could not exist."""

from __future__ import annotations

from application.errors import NotFound
from application.expiry import AccessLog
from application.log_context import about_stream
from application.placement import Deployment
from application.ports import StreamRepository
from domain.definition import StreamDefinition
from domain.stream import StreamKey


class Definitions:
    def __init__(
        self, streams: StreamRepository, deployment: Deployment, access: AccessLog
    ) -> None:
        self._streams = streams
        self.deployment = deployment
        self.access = access

    async def get(
        self,
        key: StreamKey,
        *,
        runs: frozenset[str] | None,
        delivers_data: bool = False,
        touch: bool = True,
    ) -> StreamDefinition:
        """The definition of a stream this deployment serves and that has not expired. The
        request counts as an access (a read or a write) unless `touch` is False or it is
        handled within `expiry.not_an_access` (HEAD). `runs`: the caller's (`Caller.runs`),
        always given, so that no use case forgets it: a stream outside them, or a fork whose
        sources are, is not found."""
        definition = await self._streams.definition(key)
        if definition is None:
            raise NotFound(f"no stream {key.stream_id!r} in run {key.run_id!r}")
        if runs is not None and not await self.within(key, definition, runs):
            raise NotFound(f"no stream {key.stream_id!r} in run {key.run_id!r}")
        about_stream(key, definition.placement.log_region)
        self.deployment.require_home(definition)
        await self.access.check(key, definition, touch=touch)
        if delivers_data:
            self.deployment.require_egress(definition)
        return definition

    async def within(
        self, key: StreamKey, definition: StreamDefinition, runs: frozenset[str]
    ) -> bool:
        """Whether a caller restricted to `runs` sees the stream: `sources_within`."""
        return await sources_within(self._streams, key, definition, runs)


async def sources_within(
    streams: StreamRepository, key: StreamKey, definition: StreamDefinition, runs: frozenset[str]
) -> bool:
    """Whether every stream up the fork chain of `key` is in one of `runs`. A source is kept
    (soft-deleted) while a fork reads from it, so the chain is there to walk; it is bounded
    all the same."""
    fork = definition.fork
    for _ in range(_MAX_CHAIN):
        if fork is None:
            return True
        if fork.run_id not in runs:
            return False
        source = await streams.definition(StreamKey(key.tenant, fork.run_id, fork.stream_id))
        fork = None if source is None else source.fork
    return False


# Longer fork chains than this are not followed for a run-restricted caller (they are not seen).
_MAX_CHAIN = 256
