"""The decoded definitions a process keeps (`PostgresStreams`), bounded by count and by bytes.

Definitions are immutable, so each process keeps the ones it decoded, each with the creation
time of the stream it belongs to (a stream deleted and created again under the same key is
another stream). Every stream a long-lived process ever served would otherwise stay, and a
definition may hold a schema of up to 64 KiB: the oldest are dropped past `DEFINITIONS`
entries or `DEFINITION_BYTES` of their stored form, whichever comes first."""

from __future__ import annotations

from datetime import datetime

from domain.definition import StreamDefinition
from domain.stream import StreamKey

DEFINITIONS = 10_000
# About the size of 10,000 ordinary definitions (a few hundred bytes each, stored) many times
# over, and of 512 with the largest schema.
DEFINITION_BYTES = 32 * 1024 * 1024


class DefinitionCache:
    def __init__(self, most: int = DEFINITIONS, most_bytes: int = DEFINITION_BYTES) -> None:
        self._kept: dict[StreamKey, tuple[datetime, StreamDefinition, int]] = {}
        self._most = most
        self._most_bytes = most_bytes
        self.bytes = 0  # the stored size of what is kept

    def get(self, key: StreamKey) -> tuple[datetime, StreamDefinition] | None:
        kept = self._kept.get(key)
        return None if kept is None else (kept[0], kept[1])

    def __contains__(self, key: StreamKey) -> bool:
        return key in self._kept

    def __len__(self) -> int:
        return len(self._kept)

    def keep(
        self, key: StreamKey, created_at: datetime, definition: StreamDefinition, size: int
    ) -> None:
        """Kept (`size`: its stored form's bytes), the oldest dropped past either bound."""
        self.drop(key)
        self._kept[key] = (created_at, definition, size)
        self.bytes += size
        while len(self._kept) > self._most or (
            self.bytes > self._most_bytes and len(self._kept) > 1
        ):
            self.drop(next(iter(self._kept)))

    def drop(self, key: StreamKey) -> None:
        kept = self._kept.pop(key, None)
        if kept is not None:
            self.bytes -= kept[2]

    def clear(self) -> None:
        self._kept.clear()
        self.bytes = 0
