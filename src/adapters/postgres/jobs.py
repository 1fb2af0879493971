"""Leased job queues in PostgreSQL: claimed with FOR UPDATE SKIP LOCKED, guarded by claimed_by.

Every update after the claim checks `claimed_by`, so a worker whose lease ran out (and whose job
another worker took over) cannot overwrite the newer claim's outcome."""

from __future__ import annotations

import asyncpg

from application.workers import Job
from domain.stream import StreamKey

_KEY = "tenant = $2 AND run_id = $3 AND stream_id = $4 AND claimed_by = $1"


class PostgresRetentionJobs:
    table = "retention_jobs"

    def __init__(self, pool: asyncpg.Pool, worker_id: str, lease_seconds: float = 30.0) -> None:
        self._pool = pool
        self.worker_id = worker_id
        self._lease = lease_seconds

    async def claim(self, limit: int) -> list[Job]:
        rows = await self._pool.fetch(
            f"""
            UPDATE {self.table} j
            SET claimed_by = $1, lease_until = now() + make_interval(secs => $2)
            FROM (
                SELECT tenant, run_id, stream_id FROM {self.table}
                WHERE next_attempt_at <= now() AND (lease_until IS NULL OR lease_until < now())
                ORDER BY next_attempt_at
                LIMIT $3
                FOR UPDATE SKIP LOCKED
            ) due
            WHERE (j.tenant, j.run_id, j.stream_id) = (due.tenant, due.run_id, due.stream_id)
            RETURNING j.tenant, j.run_id, j.stream_id, j.attempts
            """,
            self.worker_id,
            self._lease,
            limit,
        )
        return [Job(key=StreamKey(r[0], r[1], r[2]), attempts=r[3]) for r in rows]

    async def done(self, job: Job, next_in: float | None) -> None:
        if next_in is None:
            await self._pool.execute(
                f"DELETE FROM {self.table} WHERE {_KEY}", self.worker_id, *job.key
            )
            return
        await self._pool.execute(
            f"""UPDATE {self.table}
                SET claimed_by = NULL, lease_until = NULL, attempts = 0, last_error = NULL,
                    next_attempt_at = now() + make_interval(secs => $5)
                WHERE {_KEY}""",
            self.worker_id,
            *job.key,
            next_in,
        )

    async def failed(self, job: Job, error: str, retry_in: float) -> None:
        await self._pool.execute(
            f"""UPDATE {self.table}
                SET claimed_by = NULL, lease_until = NULL, attempts = attempts + 1,
                    last_error = $5, next_attempt_at = now() + make_interval(secs => $6)
                WHERE {_KEY}""",
            self.worker_id,
            *job.key,
            error[:2000],
            retry_in,
        )

    async def release(self, jobs: list[Job]) -> None:
        for job in jobs:
            await self._pool.execute(
                f"UPDATE {self.table} SET claimed_by = NULL, lease_until = NULL WHERE {_KEY}",
                self.worker_id,
                *job.key,
            )
