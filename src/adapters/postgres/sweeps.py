"""Leased maintenance sweeps in PostgreSQL (`maintenance_sweeps`, one row per sweep name).

A claim takes the row with FOR UPDATE SKIP LOCKED when it is due and its lease (if any) has run
out; every later update checks `claimed_by`, so a worker whose lease ran out (and whose sweep
another worker took over) cannot overwrite the newer claim's outcome."""

from __future__ import annotations

import asyncpg

# First use of a name by this process: create its row, or bring a run scheduled further ahead
# than this process's interval in to it (a restart with a shorter interval takes effect at once).
_CREATE = """
INSERT INTO maintenance_sweeps (name) VALUES ($1)
ON CONFLICT (name) DO UPDATE
SET next_attempt_at = LEAST(maintenance_sweeps.next_attempt_at, now() + make_interval(secs => $2))
WHERE $2::float8 IS NOT NULL
"""

_CLAIM = """
UPDATE maintenance_sweeps s
SET claimed_by = $2, lease_until = now() + make_interval(secs => $3)
FROM (
    SELECT name FROM maintenance_sweeps
    WHERE name = $1 AND next_attempt_at <= now() AND (lease_until IS NULL OR lease_until < now())
    FOR UPDATE SKIP LOCKED
) due
WHERE s.name = due.name
RETURNING s.attempts
"""


class PostgresSweepLeases:
    def __init__(self, pool: asyncpg.Pool, worker_id: str, lease_seconds: float = 6.0) -> None:
        self._pool = pool
        self.worker_id = worker_id
        self.lease_seconds = lease_seconds
        self._known: set[str] = set()

    async def claim(self, name: str, interval: float | None = None) -> int | None:
        if name not in self._known:
            await self._pool.execute(_CREATE, name, interval)
            self._known.add(name)
        attempts: int | None = await self._pool.fetchval(
            _CLAIM, name, self.worker_id, self.lease_seconds
        )
        return attempts

    async def renew(self, name: str) -> bool:
        status = await self._pool.execute(
            """UPDATE maintenance_sweeps SET lease_until = now() + make_interval(secs => $3)
               WHERE name = $1 AND claimed_by = $2""",
            name,
            self.worker_id,
            self.lease_seconds,
        )
        return status.endswith(" 1")

    async def done(self, name: str, next_in: float) -> None:
        await self._pool.execute(
            """UPDATE maintenance_sweeps
               SET claimed_by = NULL, lease_until = NULL, attempts = 0, last_error = NULL,
                   next_attempt_at = now() + make_interval(secs => $3)
               WHERE name = $1 AND claimed_by = $2""",
            name,
            self.worker_id,
            next_in,
        )

    async def failed(self, name: str, error: str, retry_in: float) -> None:
        await self._pool.execute(
            """UPDATE maintenance_sweeps
               SET claimed_by = NULL, lease_until = NULL, attempts = attempts + 1,
                   last_error = $3, next_attempt_at = now() + make_interval(secs => $4)
               WHERE name = $1 AND claimed_by = $2""",
            name,
            self.worker_id,
            error[:2000],
            retry_in,
        )

    async def release(self, name: str) -> None:
        await self._pool.execute(
            """UPDATE maintenance_sweeps SET claimed_by = NULL, lease_until = NULL
               WHERE name = $1 AND claimed_by = $2""",
            name,
            self.worker_id,
        )
