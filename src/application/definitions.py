"""Look a stream's definition up, or answer not-found. (The stream ports keep decoded
definitions: they are immutable, so a process may remember every one it has seen.)"""

from __future__ import annotations

from application.errors import NotFound
from application.ports import StreamRepository
from domain.definition import StreamDefinition
from domain.stream import StreamKey


class Definitions:
    def __init__(self, streams: StreamRepository) -> None:
        self._streams = streams

    async def get(self, key: StreamKey) -> StreamDefinition:
        definition = await self._streams.definition(key)
        if definition is None:
            raise NotFound(f"no stream {key.stream_id!r} in run {key.run_id!r}")
        return definition
