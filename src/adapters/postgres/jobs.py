"""Leased job queues in PostgreSQL: claimed with FOR UPDATE SKIP LOCKED, guarded by claimed_by.

Every update after the claim checks `claimed_by`, so a worker whose lease ran out (and whose job
another worker took over) cannot overwrite the newer claim's outcome."""

from __future__ import annotations

import asyncpg

from application.workers import Job
from domain.stream import StreamKey


class _LeasedJobs:
    table: str
    where_due: str = "TRUE"
    on_done_remove: str  # what "no next run" does: delete the row, or mark it done

    def __init__(self, pool: asyncpg.Pool, worker_id: str, lease_seconds: float = 30.0) -> None:
        self._pool = pool
        self.worker_id = worker_id
        self._lease = lease_seconds

    def _job(self, row: asyncpg.Record) -> Job:
        raise NotImplementedError

    def _id(self, job: Job) -> tuple[object, ...]:
        raise NotImplementedError

    _match: str  # the row of a job, as SQL over $2...

    async def claim(self, limit: int) -> list[Job]:
        rows = await self._pool.fetch(
            f"""
            UPDATE {self.table} j
            SET claimed_by = $1, lease_until = now() + make_interval(secs => $2)
            FROM (
                SELECT ctid FROM {self.table}
                WHERE next_attempt_at <= now() AND (lease_until IS NULL OR lease_until < now())
                  AND {self.where_due}
                ORDER BY next_attempt_at
                LIMIT $3
                FOR UPDATE SKIP LOCKED
            ) due
            WHERE j.ctid = due.ctid
            RETURNING j.*
            """,
            self.worker_id,
            self._lease,
            limit,
        )
        return [self._job(r) for r in rows]

    async def done(self, job: Job, next_in: float | None) -> None:
        if next_in is None:
            await self._pool.execute(
                f"{self.on_done_remove} WHERE {self._match} AND claimed_by = $1",
                self.worker_id,
                *self._id(job),
            )
            return
        n = len(self._id(job)) + 2
        await self._pool.execute(
            f"""UPDATE {self.table}
                SET claimed_by = NULL, lease_until = NULL, attempts = 0, last_error = NULL,
                    next_attempt_at = now() + make_interval(secs => ${n})
                WHERE {self._match} AND claimed_by = $1""",
            self.worker_id,
            *self._id(job),
            next_in,
        )

    async def failed(self, job: Job, error: str, retry_in: float) -> None:
        n = len(self._id(job)) + 2
        await self._pool.execute(
            f"""UPDATE {self.table}
                SET claimed_by = NULL, lease_until = NULL, attempts = attempts + 1,
                    last_error = ${n}, next_attempt_at = now() + make_interval(secs => ${n + 1})
                WHERE {self._match} AND claimed_by = $1""",
            self.worker_id,
            *self._id(job),
            error[:2000],
            retry_in,
        )

    async def release(self, jobs: list[Job]) -> None:
        for job in jobs:
            await self._pool.execute(
                f"UPDATE {self.table} SET claimed_by = NULL, lease_until = NULL "
                f"WHERE {self._match} AND claimed_by = $1",
                self.worker_id,
                *self._id(job),
            )


class PostgresRetentionJobs(_LeasedJobs):
    """One row per stream that pins retention; removed when the stream no longer needs it."""

    table = "retention_jobs"
    on_done_remove = "DELETE FROM retention_jobs"
    _match = "tenant = $2 AND run_id = $3 AND stream_id = $4"

    def _job(self, row: asyncpg.Record) -> Job:
        return Job(
            key=StreamKey(row["tenant"], row["run_id"], row["stream_id"]), attempts=row["attempts"]
        )

    def _id(self, job: Job) -> tuple[object, ...]:
        return tuple(job.key)


class PostgresDeletionJobs(_LeasedJobs):
    """The deletion outbox: object bodies to remove from the store of their region."""

    table = "deletion_outbox"
    where_due = "done_at IS NULL"
    on_done_remove = (
        "UPDATE deletion_outbox SET done_at = now(), claimed_by = NULL, lease_until = NULL"
    )
    _match = "id = $2"

    def _job(self, row: asyncpg.Record) -> Job:
        return Job(
            key=StreamKey(row["tenant"], row["run_id"], row["stream_id"]),
            attempts=row["attempts"],
            id=row["id"],
            storage_region=row["storage_region"],
            storage_key=row["storage_key"],
        )

    def _id(self, job: Job) -> tuple[object, ...]:
        return (job.id,)
