"""Stream definitions are immutable, so each process may keep the ones it has seen."""

from __future__ import annotations

from collections import OrderedDict

from application.errors import NotFound
from application.ports import StreamRepository
from domain.definition import StreamDefinition
from domain.stream import StreamKey


class DefinitionCache:
    def __init__(self, streams: StreamRepository, capacity: int = 10_000) -> None:
        self._streams = streams
        self._capacity = capacity
        self._known: OrderedDict[StreamKey, StreamDefinition] = OrderedDict()

    async def get(self, key: StreamKey) -> StreamDefinition:
        definition = self._known.get(key)
        if definition is not None:
            self._known.move_to_end(key)
            return definition
        definition = await self._streams.definition(key)
        if definition is None:
            raise NotFound(f"no stream {key.stream_id!r} in run {key.run_id!r}")
        self._known[key] = definition
        if len(self._known) > self._capacity:
            self._known.popitem(last=False)
        return definition
