"""Storage cleanup on the memory adapters."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from adapters.memory.cleanup import MemoryCleanup
from adapters.memory.deliveries import MemoryInputDeliveries
from adapters.memory.streams import MemoryStreams
from domain.stream import StreamKey
from tests.support.cleanup_contract import StorageCleanupContract


class TestMemoryCleanup(StorageCleanupContract):
    @pytest.fixture
    def repo(self) -> MemoryStreams:
        return MemoryStreams()

    @pytest.fixture
    def deliveries(self, repo: MemoryStreams) -> MemoryInputDeliveries:
        return MemoryInputDeliveries(repo)

    @pytest.fixture
    def cleanup(self, repo: MemoryStreams) -> MemoryCleanup:
        self._streams = repo
        return MemoryCleanup(repo)

    async def deliver(self, key: StreamKey, through: int, ago: timedelta) -> None:
        for sequence in range(1, through + 1):
            row = self._streams.deliveries[key][sequence]
            row.delivered, row.delivered_at = True, datetime.now(UTC) - ago

    async def rows(self, key: StreamKey) -> int:
        return len(self._streams.deliveries[key])
