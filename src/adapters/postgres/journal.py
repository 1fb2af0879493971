"""The journal's compaction in PostgreSQL: the job queue, and the bounded deletes it runs.

A snapshot (`stream_snapshot`) makes every journal row of its stream below it redundant. The
transaction that journals one also upserts the stream's row in `journal_compaction_jobs`
(`schedule_compaction`), so a committed snapshot always has its job, and a rolled-back one none.
A worker claims it like any leased job and deletes the rows below `through_version` by version
range, `batch` per statement, each statement its own short transaction that takes no stream-row
lock (writers only ever insert above the stream's version, so nothing it deletes is in use), and
each refusing while the stream's legal hold is on."""

from __future__ import annotations

import asyncpg

from adapters.postgres.connections import Connection
from adapters.postgres.jobs import PostgresRetentionJobs
from application.compaction import CompactionJob
from application.workers import Job
from domain.errors import LegalHoldActive
from domain.events import Event, decode_event
from domain.stream import StreamKey

_KEY = "tenant = $1 AND run_id = $2 AND stream_id = $3"

# A later snapshot of a stream whose job is still queued (or running) moves its target up.
_SCHEDULE = """
INSERT INTO journal_compaction_jobs (tenant, run_id, stream_id, through_version)
VALUES ($1, $2, $3, $4)
ON CONFLICT (tenant, run_id, stream_id) DO UPDATE
SET through_version = greatest(journal_compaction_jobs.through_version, excluded.through_version)
"""

# The latest snapshot and everything after it, read in one statement: a compaction running
# meanwhile only ever removes rows below it.
_READ = f"""
SELECT payload FROM stream_events
WHERE {_KEY} AND version >= coalesce(
    (SELECT max(version) FROM stream_events WHERE {_KEY} AND type = 'stream_snapshot'), 0)
ORDER BY version
"""

# Where to start, and where to stop: never past the latest snapshot actually journaled, whatever
# the job says (a job row left behind by a stream erased and created again cannot touch the new
# stream's journal above its own latest snapshot).
_RANGE = f"""
SELECT min(version),
       (SELECT max(version) FROM stream_events WHERE {_KEY} AND type = 'stream_snapshot')
FROM stream_events WHERE {_KEY}
"""

# Versions are contiguous, so a range of `batch` versions is at most `batch` rows. The hold is
# read in the same statement: a batch either ran before the hold was set, or removes nothing.
_DELETE_BATCH = f"""
WITH hold AS (
    SELECT coalesce((SELECT legal_hold FROM streams WHERE {_KEY}), false) AS held
), gone AS (
    DELETE FROM stream_events
    WHERE {_KEY} AND version >= $4 AND version < $5 AND NOT (SELECT held FROM hold)
    RETURNING 1
)
SELECT (SELECT held FROM hold), (SELECT count(*) FROM gone)
"""


async def schedule_compaction(conn: Connection, key: StreamKey, through: int) -> None:
    await conn.execute(_SCHEDULE, *key, through)


async def read_journal(pool: asyncpg.Pool, key: StreamKey) -> list[Event]:
    return [decode_event(r[0]) for r in await pool.fetch(_READ, *key)]


class PostgresJournalCompactor:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def compact(self, key: StreamKey, through_version: int, batch: int) -> int:
        found = await self._pool.fetchrow(_RANGE, *key)
        assert found is not None  # an aggregate without GROUP BY: always one row
        low, latest = found
        through_version = min(through_version, latest or 0)
        removed = 0
        while low is not None and low < through_version:
            high = min(through_version, low + batch)
            batch_row = await self._pool.fetchrow(_DELETE_BATCH, *key, low, high)
            assert batch_row is not None  # one row of two scalar subqueries
            held, count = batch_row
            if held:
                raise LegalHoldActive("a legal hold prevents compacting the journal")
            removed += count
            low = high
        return removed


class PostgresCompactionJobs(PostgresRetentionJobs):
    """One row per stream whose journal has a snapshot to compact up to."""

    table = "journal_compaction_jobs"
    on_done_remove = "DELETE FROM journal_compaction_jobs"

    def _job(self, row: asyncpg.Record) -> Job:
        return CompactionJob(
            key=StreamKey(row["tenant"], row["run_id"], row["stream_id"]),
            attempts=row["attempts"],
            through_version=row["through_version"],
        )

    async def done(self, job: Job, next_in: float | None) -> None:
        if next_in is not None:
            await super().done(job, next_in)
            return
        assert isinstance(job, CompactionJob)
        status = await self._pool.execute(
            f"DELETE FROM journal_compaction_jobs WHERE {self._match} AND claimed_by = $1"
            " AND through_version <= $5",
            self.worker_id,
            *self._id(job),
            job.through_version,
        )
        if status == "DELETE 0":  # a later snapshot moved the target while this ran: again
            await super().done(job, 0.0)
