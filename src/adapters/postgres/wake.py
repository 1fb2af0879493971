"""Wake signals by polling: until the process-wide LISTEN bus exists, a waiter rechecks
PostgreSQL every `interval` seconds. Correct, as a wake is only a reason to reread; just slower."""

from __future__ import annotations

import asyncio

from domain.stream import StreamKey


class PollingWake:
    def __init__(self, interval: float = 0.05) -> None:
        self._interval = interval

    async def wait(self, key: StreamKey, timeout: float) -> None:
        await asyncio.sleep(max(0.0, min(timeout, self._interval)))
