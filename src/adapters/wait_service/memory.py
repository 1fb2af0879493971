"""The wait service in memory, for tests: accepted events by id, in acceptance order."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec


class MemoryWaitService:
    def __init__(self) -> None:
        self.events: dict[str, dict[str, Any]] = {}
        self.publishes = 0

    async def publish(
        self, event_id: str, event: bytes, *, stream_created_at: datetime | None = None
    ) -> None:
        self.publishes += 1
        self.events.setdefault(event_id, msgspec.json.decode(event))
