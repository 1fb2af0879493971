"""Wake signals within one process: an asyncio.Event per waiter."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict

from domain.stream import StreamKey


class MemoryWake:
    def __init__(self) -> None:
        self._waiters: defaultdict[StreamKey, set[asyncio.Event]] = defaultdict(set)

    def notify(self, key: StreamKey) -> None:
        for event in self._waiters.pop(key, ()):
            event.set()

    async def wait(self, key: StreamKey, timeout: float) -> None:
        event = asyncio.Event()
        self._waiters[key].add(event)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout)
        finally:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[key]
