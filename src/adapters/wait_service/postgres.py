"""Events land in `workflow_wait_events`, keyed by event id, where a run's engine reads them."""

from __future__ import annotations

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


class PostgresWaitService:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def publish(self, event_id: str, event: bytes) -> None:
        fields = _decode(event)
        try:
            await self._pool.execute(
                """INSERT INTO workflow_wait_events
                       (event_id, tenant, run_id, stream_id, sequence, payload)
                   VALUES ($1, $2, $3, $4, $5, $6::text::jsonb)
                   ON CONFLICT (event_id) DO NOTHING""",
                event_id,
                fields.tenant,
                fields.run_id,
                fields.stream_id,
                fields.sequence,
                event.decode(),
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
            raise PublishFailed(f"wait events table: {type(error).__name__}") from error
