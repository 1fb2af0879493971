"""Last accesses in memory, over the memory streams: the same answers as `stream_access`."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from adapters.memory.streams import MemoryStreams
from application.ports import AccessRecord, RunSummary
from domain.stream import Stream, StreamKey


class MemoryStreamAccess:
    def __init__(self, streams: MemoryStreams) -> None:
        self._streams = streams
        self._accessed: dict[StreamKey, datetime] = {}
        self.writes = 0  # record_access calls, for the batching tests

    async def record_access(self, accesses: Mapping[StreamKey, datetime]) -> None:
        self.writes += 1
        for key, at in accesses.items():
            stream = await self._streams.load(key)
            if not _expiring(stream):
                continue
            known = self._accessed.get(key)
            if known is None or known < at:
                self._accessed[key] = at

    def _last(self, stream: Stream) -> datetime:
        """The creation, or a later recorded access (one recorded before an erasure and a
        new creation of the same ID is older than that creation, so it no longer counts)."""
        created = stream.state.created_at
        assert created is not None
        accessed = self._accessed.get(stream.key)
        return created if accessed is None or accessed < created else accessed

    async def last_access(self, key: StreamKey) -> AccessRecord | None:
        stream = await self._streams.load(key)
        if stream is None or not _expiring(stream):
            return None
        return AccessRecord(self._last(stream), stream.state.legal_hold.enabled)

    async def run_access(self, tenant: str, run_id: str) -> dict[str, datetime]:
        return {
            s.key.stream_id: self._last(s)
            for s in await self._streams.list_run(tenant, run_id)
            if _expiring(s)
        }

    async def expiry_candidates(
        self, now: datetime, grace: timedelta, limit: int
    ) -> list[StreamKey]:
        due: list[tuple[datetime, StreamKey]] = []
        for key in self._streams.stream_keys():
            stream = await self._streams.load(key)
            if stream is None or not _expiring(stream):
                continue
            last = self._last(stream)
            if stream.expired(now, last, grace):
                at = stream.definition.expiry.due(last)
                assert at is not None
                due.append((at, key))
        return [key for _, key in sorted(due)[:limit]]

    async def live_runs(
        self,
        tenant: str,
        after: str | None,
        limit: int,
        now: datetime,
        slack: timedelta,
        prefix: str = "",
    ) -> list[RunSummary]:
        runs: dict[str, list[datetime]] = {}
        for key in sorted(self._streams.stream_keys()):
            if (
                key.tenant != tenant
                or (after is not None and key.run_id <= after)
                or not key.run_id.startswith(prefix)
            ):
                continue
            stream = await self._streams.load(key)
            if stream is None or stream.state.soft_deleted:
                continue
            expiry = stream.definition.expiry
            if (
                expiry.enabled
                and not stream.state.legal_hold.enabled
                and expiry.passed(now, self._last(stream), slack)
            ):
                continue
            assert stream.state.created_at is not None
            runs.setdefault(key.run_id, []).append(stream.state.created_at)
        return [
            RunSummary(run_id=run_id, stream_count=len(times), created_at=min(times))
            for run_id, times in sorted(runs.items())[:limit]
        ]


def _expiring(stream: Stream | None) -> bool:
    """A stream with an expiry still to come: a soft-deleted one has none left (as its
    `stream_access` row goes in PostgreSQL); only its last fork's erasure erases it."""
    return stream is not None and stream.definition.expiry.enabled and not stream.state.soft_deleted
