"""Last accesses of streams with an expiry, in `stream_access` (migration 0482).

The row is written with the stream (its creation is its first access) and is erased with it
(a foreign key that cascades). Accesses arrive in batches, one statement per flush: an UPDATE
that only ever moves `last_access_at` forward, so an access of a stream erased meanwhile
writes nothing (no row comes back to life) and two processes' flushes commute. `due_at` is
when expiry is due without any grace (`expires_at`, or last access + `idle_seconds`), indexed,
so the sweep reads the due streams in order instead of scanning every stream.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

import asyncpg

from application.ports import AccessRecord, RunSummary
from domain.stream import StreamKey

_RECORD = """
UPDATE stream_access a
SET last_access_at = t.at,
    due_at = CASE WHEN a.idle_seconds IS NULL THEN a.due_at
                  ELSE t.at + a.idle_seconds * interval '1 second' END
FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[])
     AS t(tenant, run_id, stream_id, at)
WHERE a.tenant = t.tenant AND a.run_id = t.run_id AND a.stream_id = t.stream_id
  AND a.last_access_at < t.at
"""

_LAST_ACCESS = """
SELECT a.last_access_at, s.legal_hold
FROM stream_access a
JOIN streams s USING (tenant, run_id, stream_id)
WHERE a.tenant = $1 AND a.run_id = $2 AND a.stream_id = $3
"""

_RUN_ACCESS = """
SELECT stream_id, last_access_at FROM stream_access WHERE tenant = $1 AND run_id = $2
"""

_CANDIDATES = """
SELECT a.tenant, a.run_id, a.stream_id
FROM stream_access a
JOIN streams s USING (tenant, run_id, stream_id)
WHERE a.due_at <= $1 AND NOT s.legal_hold
  AND (a.idle_seconds IS NULL OR a.due_at <= $1 - $2::interval)
ORDER BY a.due_at
LIMIT $3
"""

# The runs page of PostgresStreams.list_runs, less the streams expired as the routes see them.
_LIVE_RUNS = """
SELECT s.run_id, count(*), min(s.created_at)
FROM streams s
LEFT JOIN stream_access a USING (tenant, run_id, stream_id)
WHERE s.tenant = $1 AND s.run_id > $2 AND NOT s.soft_deleted
  AND s.run_id >= $6 AND starts_with(s.run_id, $6)
  AND (a.tenant IS NULL OR s.legal_hold
       OR a.due_at + CASE WHEN a.idle_seconds IS NULL THEN interval '0' ELSE $5::interval END > $4)
GROUP BY s.run_id ORDER BY s.run_id LIMIT $3
"""


class PostgresStreamAccess:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def record_access(self, accesses: Mapping[StreamKey, datetime]) -> None:
        # In key order, so two processes' flushes lock shared rows in the same order.
        ordered = sorted(accesses.items())
        await self._pool.execute(
            _RECORD,
            [k.tenant for k, _ in ordered],
            [k.run_id for k, _ in ordered],
            [k.stream_id for k, _ in ordered],
            [at for _, at in ordered],
        )

    async def last_access(self, key: StreamKey) -> AccessRecord | None:
        row = await self._pool.fetchrow(_LAST_ACCESS, *key)
        return None if row is None else AccessRecord(last_access=row[0], legal_hold=row[1])

    async def run_access(self, tenant: str, run_id: str) -> dict[str, datetime]:
        return {row[0]: row[1] for row in await self._pool.fetch(_RUN_ACCESS, tenant, run_id)}

    async def expiry_candidates(
        self, now: datetime, grace: timedelta, limit: int
    ) -> list[StreamKey]:
        rows = await self._pool.fetch(_CANDIDATES, now, grace, limit)
        return [StreamKey(r[0], r[1], r[2]) for r in rows]

    async def live_runs(
        self,
        tenant: str,
        after: str | None,
        limit: int,
        now: datetime,
        slack: timedelta,
        prefix: str = "",
    ) -> list[RunSummary]:
        rows = await self._pool.fetch(_LIVE_RUNS, tenant, after or "", limit, now, slack, prefix)
        return [RunSummary(run_id=r[0], stream_count=r[1], created_at=r[2]) for r in rows]
