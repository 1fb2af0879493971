"""Leased maintenance sweeps in memory, with the PostgreSQL adapter's rules. Several
`MemorySweepLeases` (one per simulated worker) share one `SweepTable`; leases run out on the
monotonic clock, so a worker that stops renewing is taken over like in PostgreSQL."""

from __future__ import annotations

import time

import msgspec


class SweepRow(msgspec.Struct):
    next_attempt_at: float = 0.0
    claimed_by: str | None = None
    lease_until: float | None = None
    attempts: int = 0
    last_error: str | None = None


class SweepTable:
    def __init__(self) -> None:
        self.rows: dict[str, SweepRow] = {}


class MemorySweepLeases:
    def __init__(
        self, table: SweepTable | None = None, worker_id: str = "memory", lease_seconds: float = 6.0
    ) -> None:
        self.table = table or SweepTable()
        self.worker_id = worker_id
        self.lease_seconds = lease_seconds
        self._known: set[str] = set()

    def _held(self, name: str) -> SweepRow | None:
        row = self.table.rows.get(name)
        return row if row is not None and row.claimed_by == self.worker_id else None

    async def claim(self, name: str, interval: float | None = None) -> int | None:
        now = time.monotonic()
        row = self.table.rows.setdefault(name, SweepRow(next_attempt_at=now))
        if name not in self._known:
            self._known.add(name)
            if interval is not None:
                row.next_attempt_at = min(row.next_attempt_at, now + interval)
        if row.next_attempt_at > now or (row.lease_until is not None and row.lease_until >= now):
            return None
        row.claimed_by, row.lease_until = self.worker_id, now + self.lease_seconds
        return row.attempts

    async def renew(self, name: str) -> bool:
        row = self._held(name)
        if row is None:
            return False
        row.lease_until = time.monotonic() + self.lease_seconds
        return True

    async def done(self, name: str, next_in: float) -> None:
        row = self._held(name)
        if row is not None:
            row.claimed_by = row.lease_until = row.last_error = None
            row.attempts, row.next_attempt_at = 0, time.monotonic() + next_in

    async def failed(self, name: str, error: str, retry_in: float) -> None:
        row = self._held(name)
        if row is not None:
            row.claimed_by = row.lease_until = None
            row.attempts += 1
            row.last_error, row.next_attempt_at = error, time.monotonic() + retry_in

    async def release(self, name: str) -> None:
        row = self._held(name)
        if row is not None:
            row.claimed_by = row.lease_until = None
