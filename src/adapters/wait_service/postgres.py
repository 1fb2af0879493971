"""Events land in `workflow_wait_events`, keyed by event id, where a run's engine reads them."""

from __future__ import annotations

from datetime import datetime

import asyncpg
import msgspec

from application.input_delivery import PublishFailed


class _Fields(msgspec.Struct):
    """The event's fields this table keys on: its `record` is stored as it is, never decoded
    (a record decodes wherever JSON does, not always in Python: jsonb holds any number)."""

    tenant: str
    run_id: str
    stream_id: str
    sequence: int


_decode = msgspec.json.Decoder(_Fields).decode

# The event lands only while its stream's incarnation is there and not deleted: the stream's row
# is held (FOR KEY SHARE, which no commit's lock waits for) until this commits, so an erasure,
# which takes FOR UPDATE first, either ends before (and this inserts nothing) or erases the
# event with the rest. It counts in its tenant's bytes until it is deleted (migration 0511's
# triggers: its `size`, the payload as given, and its row).
_INSERT = """
INSERT INTO workflow_wait_events (event_id, tenant, run_id, stream_id, sequence, payload, size)
SELECT $1, $2, $3, $4, $5, $6::text::jsonb, octet_length($6::text)
WHERE $7::timestamptz IS NULL OR EXISTS (
    SELECT 1 FROM streams
    WHERE tenant = $2 AND run_id = $3 AND stream_id = $4 AND created_at = $7
      AND NOT soft_deleted
    FOR KEY SHARE
)
ON CONFLICT (event_id) DO NOTHING
"""


class PostgresWaitService:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def publish(
        self, event_id: str, event: bytes, *, stream_created_at: datetime | None = None
    ) -> None:
        fields = _decode(event)
        try:
            await self._pool.execute(
                _INSERT,
                event_id,
                fields.tenant,
                fields.run_id,
                fields.stream_id,
                fields.sequence,
                event.decode(),
                stream_created_at,
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
            raise PublishFailed(f"wait events table: {type(error).__name__}") from error
