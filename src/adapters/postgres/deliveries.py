"""The input-delivery queue: per stream, only the lowest undelivered record can be claimed."""

from __future__ import annotations

import asyncpg

from adapters.postgres.tenant_counts import COUNT_BYTES
from application.views import InputDeliveryStatus
from application.workers import Job
from domain.stream import StreamKey

# How many streams' heads a claim's statement ranks at most (`_CLAIM`), and how many such
# windows one claim may look through while they give too few due streams.
CLAIM_WINDOW = 128
CLAIM_WINDOWS = 8

_KEY = "tenant = $2 AND run_id = $3 AND stream_id = $4 AND sequence = $5 AND claimed_by = $1"

# Each stream's lowest undelivered row, whatever its lease, so a stream whose head is claimed
# (or backing off) offers nothing and no dispatcher can overtake another. The heads are found by a
# loose index scan (one probe of the partial index per stream with a backlog), not by reading
# every undelivered row: a backlog of N would otherwise cost N per claim. A claim looks at a
# window of at most $7 heads, from the one after the window the dispatcher looked at last
# ($4, $5, $6), going round to the first: with 20,000 streams of backlog, ranking all of them
# cost 320 ms a claim.
_HEADS_AFTER = """
        SELECT tenant, run_id, stream_id, sequence FROM input_deliveries d
        WHERE d.delivered_at IS NULL
          AND (d.tenant, d.run_id, d.stream_id) > (h.tenant, h.run_id, h.stream_id)
        ORDER BY tenant, run_id, stream_id, sequence LIMIT 1
"""
_CLAIM = f"""
WITH RECURSIVE ahead(tenant, run_id, stream_id, sequence, n) AS (
    (SELECT tenant, run_id, stream_id, sequence, 1 FROM input_deliveries
     WHERE delivered_at IS NULL AND (tenant, run_id, stream_id) > ($4::text, $5::text, $6::text)
     ORDER BY tenant, run_id, stream_id, sequence LIMIT 1)
    UNION ALL
    SELECT x.tenant, x.run_id, x.stream_id, x.sequence, h.n + 1
    FROM ahead h, LATERAL ({_HEADS_AFTER}) x
    WHERE h.n < $7 AND (NOT $11 OR (h.tenant, h.run_id, h.stream_id) < ($8, $9, $10))
),
-- From the first stream up to where the claim started ($8, $9, $10): walked only when the
-- streams after the cursor are fewer than the window (an Append runs its second part only for
-- the rows the LIMIT still wants), so that a window holds as many heads as there are, up to its
-- size. Once a window of this claim went round ($11), the cursor is in this part already: the
-- walk ahead of it stops where the claim started, and this part is not walked again.
behind(tenant, run_id, stream_id, sequence, n) AS (
    (SELECT tenant, run_id, stream_id, sequence, 1 FROM input_deliveries
     WHERE delivered_at IS NULL AND $8::text <> '' AND NOT $11::bool
     ORDER BY tenant, run_id, stream_id, sequence LIMIT 1)
    UNION ALL
    SELECT x.tenant, x.run_id, x.stream_id, x.sequence, h.n + 1
    FROM behind h, LATERAL ({_HEADS_AFTER}) x
    WHERE h.n < $7 AND (h.tenant, h.run_id, h.stream_id) < ($8::text, $9::text, $10::text)
),
heads AS (
    SELECT tenant, run_id, stream_id, sequence, wrapped, row_number() OVER () AS place FROM (
        (SELECT tenant, run_id, stream_id, sequence, false AS wrapped FROM ahead
         WHERE NOT $11 OR (tenant, run_id, stream_id) <= ($8, $9, $10))
        UNION ALL
        (SELECT tenant, run_id, stream_id, sequence, true FROM behind
         WHERE (tenant, run_id, stream_id) <= ($8, $9, $10))
        LIMIT $7
    ) w
),
state AS (
    SELECT h.tenant, h.run_id, h.stream_id, h.sequence, x.next_attempt_at,
           x.next_attempt_at <= now() AND (x.lease_until IS NULL OR x.lease_until < now()) AS due,
           x.lease_until >= now() AS held
    FROM heads h JOIN input_deliveries x USING (tenant, run_id, stream_id, sequence)
),
-- Turns across tenants: a tenant's streams already held by a dispatcher count as its first
-- turns, and each tenant's due streams come least recently served first (`done` moves a served
-- stream's next record to the back). A claim takes every tenant's first turn before anyone's
-- second: a tenant with a thousand streams of backlog delays another's by a job or a few
-- windows, not by its whole backlog.
ranked AS (
    SELECT tenant, run_id, stream_id, sequence, next_attempt_at, due,
           count(*) FILTER (WHERE held) OVER (PARTITION BY tenant)
           + row_number() OVER (
               PARTITION BY tenant, due ORDER BY next_attempt_at, run_id, stream_id
           ) AS turn
    FROM state
),
picked AS (
    SELECT tenant, run_id, stream_id, sequence FROM ranked WHERE due
    ORDER BY turn, next_attempt_at, tenant, run_id, stream_id
    LIMIT $3
),
-- Rows another transaction holds (a run's deletion, another dispatcher's claim) are passed
-- over, never waited for: an UPDATE of the picked rows locked them in no set order, and met a
-- run's deletion, which locks them in key order, in a deadlock.
locked AS (
    SELECT d.tenant, d.run_id, d.stream_id, d.sequence FROM input_deliveries d
    JOIN picked p USING (tenant, run_id, stream_id, sequence)
    WHERE d.delivered_at IS NULL AND (d.lease_until IS NULL OR d.lease_until < now())
    FOR UPDATE OF d SKIP LOCKED
),
claimed AS (
    UPDATE input_deliveries d
    SET claimed_by = $1, lease_until = now() + make_interval(secs => $2)
    FROM locked
    WHERE (d.tenant, d.run_id, d.stream_id, d.sequence)
          = (locked.tenant, locked.run_id, locked.stream_id, locked.sequence)
    RETURNING d.tenant, d.run_id, d.stream_id, d.sequence, d.attempts
)
SELECT tenant, run_id, stream_id, sequence, attempts, NULL::boolean FROM claimed
UNION ALL
-- The window's last head (no sequence), how many it held and whether it went round past the
-- last stream: where the next window starts after, and whether there may be more.
(SELECT tenant, run_id, stream_id, NULL, place, wrapped FROM heads ORDER BY place DESC LIMIT 1)
"""

_PLEDGES_DELIVERED = "SELECT tenant, pledge AS size FROM delivered WHERE pledge IS NOT NULL"

# Marks the claimed record delivered, for the statement after it to go on from `delivered`; what
# its event pledged to its tenant's bytes is given back (its event, landed, counts itself). The
# pledge stays on the row, which is delivered now (and no longer claimed: this matches it once):
# what takes undelivered rows' pledges back passes over it.
_DELIVERED = f"""
WITH delivered AS (
    UPDATE input_deliveries
    SET delivered_at = now(), claimed_by = NULL, lease_until = NULL, last_error = NULL
    WHERE {_KEY}
    RETURNING tenant, sequence, pledge
), unpledged AS (
    {COUNT_BYTES.format(sign="-", records=_PLEDGES_DELIVERED)}
)
"""

_ADVANCE = (
    _DELIVERED
    + """
UPDATE input_deliveries d
SET claimed_by = $1, lease_until = now() + make_interval(secs => $6)
FROM delivered
WHERE d.tenant = $2 AND d.run_id = $3 AND d.stream_id = $4 AND d.sequence = delivered.sequence + 1
  AND d.delivered_at IS NULL AND d.next_attempt_at <= now()
  AND (d.lease_until IS NULL OR d.lease_until < now())
RETURNING d.sequence, d.attempts
"""
)

# A stream handed back after a job's batch goes to the back of its tenant's turns: its next
# record counts as waiting from now (`next_attempt_at` orders a tenant's due streams in `_CLAIM`).
_DONE = (
    _DELIVERED
    + """
UPDATE input_deliveries d SET next_attempt_at = greatest(d.next_attempt_at, now())
FROM delivered
WHERE d.tenant = $2 AND d.run_id = $3 AND d.stream_id = $4 AND d.sequence = delivered.sequence + 1
  AND d.delivered_at IS NULL
"""
)

# What a dispatcher holds of a stream is its one claimed row, which moves down the stream as
# records are delivered (`advance`), so leases are renewed by stream, not by sequence.
_RENEW = """
UPDATE input_deliveries SET lease_until = now() + make_interval(secs => $2)
WHERE claimed_by = $1 AND delivered_at IS NULL
  AND (tenant, run_id, stream_id) IN (SELECT * FROM unnest($3::text[], $4::text[], $5::text[]))
RETURNING tenant, run_id, stream_id
"""

_STILL_CLAIMED = """
SELECT DISTINCT tenant, run_id, stream_id FROM input_deliveries
WHERE claimed_by = $1 AND delivered_at IS NULL
  AND (tenant, run_id, stream_id) IN (SELECT * FROM unnest($2::text[], $3::text[], $4::text[]))
"""

_STATUS = """
SELECT coalesce(max(sequence) FILTER (WHERE delivered_at IS NOT NULL), 0),
       count(*) FILTER (WHERE delivered_at IS NULL),
       (SELECT last_error FROM input_deliveries
        WHERE tenant = $1 AND run_id = $2 AND stream_id = $3 AND delivered_at IS NULL
        ORDER BY sequence LIMIT 1)
FROM input_deliveries WHERE tenant = $1 AND run_id = $2 AND stream_id = $3
"""


class PostgresInputDeliveries:
    def __init__(
        self,
        pool: asyncpg.Pool,
        worker_id: str,
        lease_seconds: float = 6.0,
        window: int = CLAIM_WINDOW,
    ) -> None:
        self._pool = pool
        self.worker_id = worker_id
        self.lease_seconds = lease_seconds
        self.window = window
        self._after = ("", "", "")  # the last head of the window the last claim looked at

    async def claim(self, limit: int) -> list[Job]:
        """Up to `limit` streams, from the next window and, while a full window gave fewer
        (its streams held by dispatchers, or backing off), from the ones after it: up to
        CLAIM_WINDOWS windows a claim, and never past where it started (once a window went
        round past the last stream, the walk stops there, so no head is ranked twice in one
        claim)."""
        jobs: list[Job] = []
        window = max(self.window, limit)
        started, went_round = self._after, False
        for _ in range(CLAIM_WINDOWS):
            rows = await self._pool.fetch(
                _CLAIM,
                self.worker_id,
                self.lease_seconds,
                limit - len(jobs),
                *self._after,
                window,
                *started,
                went_round,
            )
            seen = 0
            for r in rows:
                if r[3] is None:
                    self._after, seen, went_round = (r[0], r[1], r[2]), r[4], went_round or r[5]
                else:
                    jobs.append(Job(key=StreamKey(r[0], r[1], r[2]), attempts=r[4], id=r[3]))
            if not seen and not went_round:
                self._after = ("", "", "")  # no heads at all: from the first next time
            if len(jobs) >= limit or seen < window:
                break
        return jobs

    async def renew(self, jobs: list[Job]) -> list[Job]:
        if not jobs:
            return []
        columns = [list(column) for column in zip(*(job.key for job in jobs), strict=True)]
        rows = await self._pool.fetch(_RENEW, self.worker_id, self.lease_seconds, *columns)
        held = {StreamKey(*r) for r in rows}
        missing = [job for job in jobs if job.key not in held]
        if missing:
            # An `advance` that committed while the UPDATE waited on its row moved the claim to
            # a row the UPDATE's snapshot did not see as ours: it skips both and answers
            # nothing for the stream. A plain read (it waits on no lock) sees the claim on one
            # row or the other, and `advance` gave the new one a fresh lease.
            columns = [list(c) for c in zip(*(job.key for job in missing), strict=True)]
            rows = await self._pool.fetch(_STILL_CLAIMED, self.worker_id, *columns)
            held |= {StreamKey(*r) for r in rows}
        return [job for job in jobs if job.key not in held]

    async def done(self, job: Job, next_in: float | None) -> None:
        await self._pool.execute(_DONE, self.worker_id, *job.key, job.id)

    async def failed(self, job: Job, error: str, retry_in: float) -> None:
        await self._pool.execute(
            f"""UPDATE input_deliveries
                SET claimed_by = NULL, lease_until = NULL, attempts = attempts + 1,
                    last_error = $6, next_attempt_at = now() + make_interval(secs => $7)
                WHERE {_KEY}""",
            self.worker_id,
            *job.key,
            job.id,
            error[:2000],
            retry_in,
        )

    async def release(self, jobs: list[Job]) -> None:
        for job in jobs:
            await self._pool.execute(
                f"UPDATE input_deliveries SET claimed_by = NULL, lease_until = NULL WHERE {_KEY}",
                self.worker_id,
                *job.key,
                job.id,
            )

    async def advance(self, job: Job) -> Job | None:
        """Mark `job` delivered and, in the same statement, claim the stream's next record if it
        is there and free: a stream's backlog then costs one primary-key step per record."""
        row = await self._pool.fetchrow(
            _ADVANCE, self.worker_id, *job.key, job.id, self.lease_seconds
        )
        return None if row is None else Job(key=job.key, attempts=row[1], id=row[0])

    async def status(self, key: StreamKey) -> InputDeliveryStatus:
        row = await self._pool.fetchrow(_STATUS, *key)
        assert row is not None  # aggregates without GROUP BY: always one row
        return InputDeliveryStatus(delivered_through=row[0], pending=row[1], last_error=row[2])

    async def delivered_through(self, key: StreamKey) -> int:
        return (await self.status(key)).delivered_through
