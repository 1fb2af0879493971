"""The figures /metrics reports from PostgreSQL: outbox backlogs and object intents.

The deletion backlog counts the bodies to delete, those waiting for a retry or a legal hold
included; one armed by an upload under way (application/deletions.py) is no backlog until it
falls due (when no put of it can land), and its age counts from then."""

from __future__ import annotations

from adapters.postgres.bounded import BoundedPool
from application.deletions import UPLOADING
from application.ports import Backlog, StoredFigures

_BACKLOGS = f"""
SELECT 'input_delivery', count(*), coalesce(extract(epoch FROM now() - min(r.appended_at)), 0)
FROM input_deliveries d JOIN stream_records r USING (tenant, run_id, stream_id, sequence)
WHERE d.delivered_at IS NULL
UNION ALL
SELECT 'deletion', count(*),
       coalesce(extract(epoch FROM now() - min(CASE WHEN reason = '{UPLOADING}'
                                                    THEN next_attempt_at
                                                    ELSE created_at END)), 0)
FROM deletion_outbox
WHERE done_at IS NULL AND NOT (reason = '{UPLOADING}' AND next_attempt_at > now())
UNION ALL
SELECT 'subscription_wake', count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)
FROM ds_wake_deliveries WHERE delivered_at IS NULL
"""
_OBJECTS = "SELECT state, count(*) FROM object_intents GROUP BY state"


class PostgresFigures:
    def __init__(self, pool: BoundedPool) -> None:
        self._pool = pool

    async def figures(self) -> StoredFigures:
        backlogs = [
            Backlog(outbox, pending, float(lag))
            for outbox, pending, lag in await self._pool.fetch(_BACKLOGS)
        ]
        objects = {state: count for state, count in await self._pool.fetch(_OBJECTS)}
        return StoredFigures(backlogs, objects)
