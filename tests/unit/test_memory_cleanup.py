"""Storage cleanup on the memory adapters."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from adapters.memory.cleanup import MemoryCleanup
from adapters.memory.deliveries import MemoryInputDeliveries
from adapters.memory.streams import MemoryStreams
from adapters.objects.memory import MemoryObjectStore
from application.cleanup import Cleanup
from application.objects import ObjectStores
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


class _Broken:
    async def sweep_incomplete(self, older_than: timedelta) -> int:
        raise OSError("the store is out of reach")


async def test_every_regions_store_is_swept_even_when_one_fails() -> None:
    eu, us = MemoryObjectStore(), MemoryObjectStore()
    stores = ObjectStores({"eu": eu, "us": us, "ap": _Broken()})  # type: ignore[dict-item]
    gate = asyncio.Event()

    async def held() -> AsyncIterator[bytes]:
        yield b"part"
        await gate.wait()

    puts = [asyncio.create_task(s.put("t/r/s/o", held(), max_size=100)) for s in (eu, us)]
    await asyncio.sleep(0.01)
    cleanup = Cleanup(MemoryCleanup(MemoryStreams()), stores, 1.0, upload_age_seconds=0.001)
    with pytest.raises(OSError, match="out of reach"):
        await cleanup.abandoned_uploads()
    gate.set()
    for put in puts:  # both were swept, the broken store notwithstanding
        with pytest.raises(RuntimeError, match="swept"):
            await put
