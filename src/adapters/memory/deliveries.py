"""The input-delivery queue in memory, with the PostgreSQL one's rule: per stream, only the
lowest undelivered record can be claimed."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from adapters.memory.streams import MemoryStreams
from application.views import InputDeliveryStatus
from application.workers import Job
from domain.stream import StreamKey


def _sequence(job: Job) -> int:
    """The record a delivery job is for: every job this queue hands out names one."""
    assert job.id is not None
    return job.id


class MemoryInputDeliveries:
    """One process holds every claim, so a lease never runs out: renewing only reports the
    streams this worker no longer holds."""

    lease_seconds = 6.0

    def __init__(self, streams: MemoryStreams, worker_id: str = "memory") -> None:
        self._streams = streams
        self.worker_id = worker_id

    async def claim(self, limit: int) -> list[Job]:
        """Turns across tenants, as the PostgreSQL claim takes them: a tenant's held streams
        count as its first turns, and its due streams come least recently served first."""
        now = time.monotonic()
        held: dict[str, int] = {}
        due: dict[str, list[tuple[float, StreamKey, int]]] = {}
        for key, rows in self._streams.deliveries.items():
            pending = sorted(s for s, row in rows.items() if not row.delivered)
            if not pending:
                continue
            head = rows[pending[0]]
            if head.claimed_by is not None:
                held[key.tenant] = held.get(key.tenant, 0) + 1
            elif head.not_before <= now:
                due.setdefault(key.tenant, []).append((head.not_before, key, pending[0]))
        turns = [
            (held.get(tenant, 0) + turn, waiting, key, sequence)
            for tenant, heads in due.items()
            for turn, (waiting, key, sequence) in enumerate(sorted(heads), start=1)
        ]
        jobs = []
        for _, _, key, sequence in sorted(turns)[:limit]:
            head = self._streams.deliveries[key][sequence]
            head.claimed_by = self.worker_id
            jobs.append(Job(key=key, attempts=head.attempts, id=sequence))
        return jobs

    async def renew(self, jobs: list[Job]) -> list[Job]:
        def held(key: StreamKey) -> bool:
            rows = self._streams.deliveries.get(key, {}).values()
            return any(not r.delivered and r.claimed_by == self.worker_id for r in rows)

        return [job for job in jobs if not held(job.key)]

    async def done(self, job: Job, next_in: float | None) -> None:
        row = self._streams.deliveries[job.key][_sequence(job)]
        row.delivered, row.claimed_by, row.last_error = True, None, None
        row.delivered_at = datetime.now(UTC)
        following = self._streams.deliveries[job.key].get(_sequence(job) + 1)
        if following is not None and not following.delivered:  # to the back of its tenant's turns
            following.not_before = max(following.not_before, time.monotonic())

    async def failed(self, job: Job, error: str, retry_in: float) -> None:
        row = self._streams.deliveries[job.key][_sequence(job)]
        row.claimed_by, row.last_error = None, error
        row.attempts += 1
        row.not_before = time.monotonic() + retry_in

    async def release(self, jobs: list[Job]) -> None:
        for job in jobs:
            self._streams.deliveries[job.key][_sequence(job)].claimed_by = None

    async def advance(self, job: Job) -> Job | None:
        await self.done(job, None)
        rows = self._streams.deliveries[job.key]
        row = rows.get(_sequence(job) + 1)
        if row is None or row.delivered or row.claimed_by or row.not_before > time.monotonic():
            return None
        row.claimed_by = self.worker_id
        return Job(key=job.key, attempts=row.attempts, id=_sequence(job) + 1)

    async def status(self, key: StreamKey) -> InputDeliveryStatus:
        rows = self._streams.deliveries.get(key, {})
        delivered = [s for s, r in rows.items() if r.delivered]
        pending = sorted(s for s, r in rows.items() if not r.delivered)
        return InputDeliveryStatus(
            delivered_through=max(delivered, default=0),
            pending=len(pending),
            last_error=rows[pending[0]].last_error if pending else None,
        )

    async def delivered_through(self, key: StreamKey) -> int:
        return (await self.status(key)).delivered_through
