"""How many streams each tenant holds, as the triggers of migration 0505 count them.

Every statement that inserts or deletes rows of `streams` adds its change to the row of its own
backend (`pg_backend_pid()`) in `tenant_stream_counts`, in its own transaction: so the count is
exact once committed, whatever path created or erased the streams, and no two transactions wait
for each other on it. A tenant's count is the sum of its rows: one per backend that changed its
streams since the last fold, and backend 0's. The fold moves the rows of backends that have
ended into backend 0's; a backend still running keeps its row (its transaction may hold it)."""

from __future__ import annotations

from typing import Any

_COUNT = """
SELECT coalesce(sum(streams), 0)::bigint FROM tenant_stream_counts WHERE tenant = $1
"""

# The rows of backends no longer running, summed into backend 0's per tenant; then backend 0's
# rows that came to nothing go. A backend that starts meanwhile with the pid of one that ended
# finds its row gone (or takes it over: the sums are what count), never a count lost. A row
# some transaction holds is passed over (SKIP LOCKED), not waited for: it is a running
# backend's (one that took an ended one's pid since the fold looked), and waiting for it while
# it waits for another row the fold holds would be a deadlock.
_FOLD = """
WITH gone AS (
    DELETE FROM tenant_stream_counts c
    WHERE (c.tenant, c.backend) IN (
        SELECT o.tenant, o.backend FROM tenant_stream_counts o
        WHERE o.backend <> 0
          AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = o.backend)
        FOR UPDATE SKIP LOCKED)
    RETURNING tenant, streams
), folded AS (
    INSERT INTO tenant_stream_counts (tenant, backend, streams)
    SELECT tenant, 0, sum(streams) FROM gone GROUP BY tenant ORDER BY tenant
    ON CONFLICT (tenant, backend)
    DO UPDATE SET streams = tenant_stream_counts.streams + excluded.streams
    RETURNING 1
)
SELECT count(*) FROM gone
"""
_EMPTY = "DELETE FROM tenant_stream_counts WHERE backend = 0 AND streams = 0"


async def tenant_streams(pool: Any, tenant: str) -> int:
    """The streams `tenant` holds (a soft-deleted one too, until it is erased)."""
    count: int = await pool.fetchval(_COUNT, tenant)
    return count


async def fold_tenant_stream_counts(pool: Any) -> int:
    """Fold the rows of ended backends into each tenant's row of backend 0; answers how many
    rows it folded."""
    folded: int = await pool.fetchval(_FOLD)
    await pool.execute(_EMPTY)
    return folded
