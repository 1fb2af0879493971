"""Storage cleanup in memory, with the PostgreSQL adapter's rules for what memory keeps.

Memory keeps input-delivery rows (in `MemoryStreams.deliveries`). It keeps no done deletion
outbox rows (nothing in memory marks a queued deletion done) and no gap evidence (only the
PostgreSQL wake bus records any), so those two sweeps have nothing to remove here."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from adapters.memory.streams import MemoryStreams
from domain.stream import StreamKey


class MemoryCleanup:
    def __init__(self, streams: MemoryStreams) -> None:
        self._streams = streams

    async def _held(self, key: StreamKey) -> bool:
        stream = await self._streams.load(key)
        return stream is not None and stream.state.legal_hold.enabled

    async def forget_delivered_inputs(self, older_than: timedelta, batch: int = 1000) -> int:
        cutoff = datetime.now(UTC) - older_than
        removed = 0
        for key, rows in self._streams.deliveries.items():
            if await self._held(key):
                continue
            delivered = [s for s, r in rows.items() if r.delivered]
            if not delivered:
                continue
            highest = max(delivered)  # what delivered_through reads: it stays
            for sequence in delivered:
                row = rows[sequence]
                if sequence != highest and row.delivered_at and row.delivered_at < cutoff:
                    del rows[sequence]
                    removed += 1
        return removed

    async def forget_done_deletions(self, older_than: timedelta, batch: int = 1000) -> int:
        return 0

    async def forget_gap_evidence(self, older_than: timedelta, batch: int = 1000) -> int:
        return 0

    async def fold_tenant_counts(self) -> int:
        return 0  # memory counts a tenant's streams from its rows: nothing to fold
