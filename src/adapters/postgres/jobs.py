"""Leased job queues in PostgreSQL: claimed with FOR UPDATE SKIP LOCKED, guarded by claimed_by.

Every update after the claim checks `claimed_by`, so a worker whose lease ran out (and whose job
another worker took over) cannot overwrite the newer claim's outcome. The worker renews the
leases of what it holds (`renew`) while it works, so the lease only has to outlast a renewal
interval, not the slowest job."""

from __future__ import annotations

import asyncpg

from application.workers import Job
from domain.stream import StreamKey


class _LeasedJobs:
    table: str
    where_due: str = "TRUE"
    on_done_remove: str  # what "no next run" does: delete the row, or mark it done

    def __init__(self, pool: asyncpg.Pool, worker_id: str, lease_seconds: float = 6.0) -> None:
        self._pool = pool
        self.worker_id = worker_id
        self.lease_seconds = lease_seconds

    def _job(self, row: asyncpg.Record) -> Job:
        raise NotImplementedError

    def _id(self, job: Job) -> tuple[object, ...]:
        raise NotImplementedError

    _match: str  # the row of a job, as SQL over $2...
    _held: str  # the rows of several jobs, as SQL over the arrays $3...
    _held_columns: tuple[str, ...]  # what identifies a job's row

    def _ids(self, jobs: list[Job]) -> tuple[list[object], ...]:
        raise NotImplementedError

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
            self.lease_seconds,
            limit,
        )
        return [self._job(r) for r in rows]

    async def renew(self, jobs: list[Job]) -> list[Job]:
        if not jobs:
            return []
        rows = await self._pool.fetch(
            f"""UPDATE {self.table} SET lease_until = now() + make_interval(secs => $2)
                WHERE claimed_by = $1 AND {self._held}
                RETURNING {", ".join(self._held_columns)}""",
            self.worker_id,
            self.lease_seconds,
            *self._ids(jobs),
        )
        held = {tuple(r) for r in rows}
        return [job for job in jobs if self._id(job) not in held]

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
    _held = (
        "(tenant, run_id, stream_id) IN (SELECT * FROM unnest($3::text[], $4::text[], $5::text[]))"
    )
    _held_columns = ("tenant", "run_id", "stream_id")

    def _job(self, row: asyncpg.Record) -> Job:
        return Job(
            key=StreamKey(row["tenant"], row["run_id"], row["stream_id"]),
            attempts=row["attempts"],
            claimed_by=row["claimed_by"],
        )

    def _id(self, job: Job) -> tuple[object, ...]:
        return tuple(job.key)

    def _ids(self, jobs: list[Job]) -> tuple[list[object], ...]:
        return tuple(list(column) for column in zip(*(job.key for job in jobs), strict=True))


class PostgresDeletionJobs(_LeasedJobs):
    """The deletion outbox: object bodies to remove from the store of their region."""

    table = "deletion_outbox"
    where_due = "done_at IS NULL"
    on_done_remove = (
        "UPDATE deletion_outbox SET done_at = now(), claimed_by = NULL, lease_until = NULL"
    )
    _match = "id = $2"
    _held = "id = ANY($3::bigint[])"
    _held_columns = ("id",)

    def _job(self, row: asyncpg.Record) -> Job:
        return Job(
            key=StreamKey(row["tenant"], row["run_id"], row["stream_id"]),
            attempts=row["attempts"],
            id=row["id"],
            storage_region=row["storage_region"],
            storage_key=row["storage_key"],
            reason=row["reason"],
            upload_until=row["upload_until"],
        )

    def _id(self, job: Job) -> tuple[object, ...]:
        return (job.id,)

    def _ids(self, jobs: list[Job]) -> tuple[list[object], ...]:
        return ([job.id for job in jobs],)
